"""Driver program for test_gpus: argv = master, JSON of Spark settings, JSON of fit arguments, and how
many fits to run one after the other (default 1: later fits may take spares). Prints one JSON line: the
last fit's workers (executor, CUDA_VISIBLE_DEVICES as each training process read it, warm start, what
carried its gradients) and every fit's as "fits", the GpuExchangeWarnings of the last fit, or the error."""

import json
import sys
import warnings

import pandas as pd
from conftest import digits_cnn, digits_frames, make_spark

import tfbarrier

master, conf, kwargs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
fits = int(sys.argv[4]) if len(sys.argv) > 4 else 1
spark = make_spark(master, **{"spark.pyspark.python": sys.executable, **conf})
train = digits_frames()[0].iloc[:256]
try:
    outcome = {"fits": []}
    for _ in range(fits):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = tfbarrier.fit(spark.createDataFrame(pd.DataFrame(train)), digits_cnn(), features="pixels",
                                   label="digit", epochs=1, **kwargs)
        outcome["warned"] = [str(w.message) for w in caught if w.category.__name__ == "GpuExchangeWarning"]
        outcome["workers"] = [{key: w[key] for key in ("executor", "gpus", "warm_start", "communication")}
                              for w in result.workers]
        outcome["fits"].append(outcome["workers"])
except tfbarrier.errors.TfBarrierError as exc:
    outcome = {"error": type(exc).__name__, "message": str(exc)}
print("RESULT " + json.dumps(outcome))
spark.stop()
