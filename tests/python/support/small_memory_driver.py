"""Driver program for test_memory: a local[2] session with little memory set aside, and a fit that
cannot fit in it. argv[1]: "executor" (spark.executor.pyspark.memory=700m: the model is refused before
the stage) or "driver" (spark.driver.memory=512m and no driver link: the model goes through the JVM,
which cannot hold it). Prints one JSON line: the error's class and message, and whether a small fit
in the same session works afterwards."""

import json
import sys

import numpy as np
import pandas as pd
from conftest import digits_cnn, digits_frames, make_spark

import tfbarrier

conf = {"executor": {"spark.executor.pyspark.memory": "700m"},
        "driver": {"spark.driver.memory": "512m", "spark.tfbarrier.driverLink": "false"}}[sys.argv[1]]
spark = make_spark("local[2]", **conf)
import keras  # noqa: E402 - after Spark's start, as a user's script

rows = np.random.default_rng(0).random((64, 1024), dtype=np.float32)
df = spark.createDataFrame(pd.DataFrame({"x": list(rows), "y": np.zeros(64, dtype=np.int64)}))
model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096), keras.layers.Dense(4096),
                          keras.layers.Dense(10)])  # 21 M parameters, 84 MB
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
outcome = {}
try:
    tfbarrier.fit(df, model, features="x", label="y", batch_size=32, num_workers=2, verbose=0)
    outcome["error"] = None
except Exception as exc:  # noqa: B902 - reported to the test
    outcome.update(error=type(exc).__name__, message=str(exc))
small = spark.createDataFrame(digits_frames()[0].iloc[:128])
if sys.argv[1] == "driver":
    result = tfbarrier.fit(small, digits_cnn(), features="pixels", label="digit", batch_size=32, num_workers=2,
                           verbose=0)
    outcome["then"] = {"epochs": len(result.history["loss"])}
print("RESULT " + json.dumps(outcome))
