"""Driver program for test_standalone: fit the digits CNN on the cluster given as argv[1] and print
the result as one JSON line (a second SparkContext cannot live in the test process)."""

import json
import sys

from conftest import digits_cnn, digits_frames, held_out_accuracy, make_spark

import tfbarrier

spark = make_spark(sys.argv[1], **{"spark.executor.memory": "1g", "spark.pyspark.python": sys.executable})
train, held_out = digits_frames()
result = tfbarrier.fit(spark.createDataFrame(train), digits_cnn(), features="pixels", label="digit",
                       epochs=4, batch_size=64, num_workers=2, seed=1)
executors = sorted(
    {e.host() + ":" + str(e.port()) for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}
)
print("RESULT " + json.dumps({
    "accuracy": held_out_accuracy(result.model, held_out),
    "workers": [{k: w[k] for k in ("index", "host", "rows", "checksum", "steps")} for w in result.workers],
    "executors": executors,
}))
spark.stop()
