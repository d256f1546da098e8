"""Driver program for test_cluster_checks: what a newcomer gets who runs a script as .venv/bin/python
without activating the venv, so that Spark's Python workers run the `python3` first on PATH (the test
puts one there without pyarrow). argv[1:]: the masters, tried in turn. Prints one JSON line: per master and call, the error class, message and seconds."""

import json
import os
import sys
import time

from conftest import digits_cnn, digits_frames, make_spark

import tfbarrier

outcomes = {}
for master in sys.argv[1:]:  # local[2]: checked on the driver; local-cluster: the tasks' failure translated
    os.environ.pop("PYSPARK_PYTHON", None)  # conftest and digits_cnn's mnist_demo set it; a newcomer's shell does not
    spark = make_spark(master)
    df = spark.createDataFrame(digits_frames()[0].iloc[:64])
    calls = {
        "fit": lambda: tfbarrier.fit(df, digits_cnn(), features="pixels", label="digit", verbose=0),
        "predict": lambda: tfbarrier.predict(df, digits_cnn(), features="pixels"),
        "apply": lambda: tfbarrier.apply(df, lambda partition, barrier: partition, verbose=0),
    }
    outcome = outcomes[master] = {"executor_python": spark.sparkContext.pythonExec}
    for name, call in calls.items():
        started = time.time()
        try:
            call()
            outcome[name] = {"error": None}
        except Exception as exc:  # noqa: B902 - reported to the test
            outcome[name] = {"error": type(exc).__name__, "message": str(exc), "seconds": time.time() - started}
    spark.stop()
print("RESULT " + json.dumps(outcomes))
