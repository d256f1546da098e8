"""Driver program for test_gpus: argv = master, JSON of Spark settings, JSON of fit arguments.
Prints one JSON line: each worker's executor and CUDA_VISIBLE_DEVICES, or the error."""

import json
import sys

import pandas as pd
from conftest import digits_cnn, digits_frames, make_spark

import tfbarrier

master, conf, kwargs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
spark = make_spark(master, **{"spark.pyspark.python": sys.executable, **conf})
train = digits_frames()[0].iloc[:256]
try:
    result = tfbarrier.fit(spark.createDataFrame(pd.DataFrame(train)), digits_cnn(), features="pixels",
                           label="digit", epochs=1, **kwargs)
    outcome = {"workers": [{"executor": w["executor"], "gpus": w["gpus"]} for w in result.workers]}
except tfbarrier.errors.TfBarrierError as exc:
    outcome = {"error": type(exc).__name__, "message": str(exc)}
print("RESULT " + json.dumps(outcome))
spark.stop()
