"""Driver program for test_connect: fit, run and predict through a local Spark Connect session (a
process of its own: the test session already has a classic SparkContext). Prints one JSON line."""

import json
import os

import numpy as np
from conftest import digits_cnn, digits_frames, held_out_accuracy
from pyspark.sql import SparkSession
from test_run import tutorial_train

import tfbarrier
from tfbarrier.errors import ClusterError

spark = SparkSession.builder.remote("local[2]").getOrCreate()
train, held_out = digits_frames()
outcome = {"session": type(spark).__module__}

result = tfbarrier.fit(spark.createDataFrame(train), digits_cnn(), features="pixels", label="digit",
                       epochs=4, batch_size=64, num_workers=2, seed=1)
outcome["fit"] = {"accuracy": held_out_accuracy(result.model, held_out),
                  "checksums": [w["checksum"] for w in result.workers], "rows": [w["rows"] for w in result.workers],
                  "epochs": len(result.history["loss"]), "progress_from": sorted({m["worker"] for m in result.progress})}

outcome["run"] = tfbarrier.run(tutorial_train, num_workers=2, args=(1,), kwargs={"steps_per_epoch": 3}, spark=spark)

held_out = held_out.assign(row_id=np.arange(len(held_out)))
scored = tfbarrier.predict(spark.createDataFrame(held_out).repartition(4), result.model, features="pixels")
rows = scored.select("row_id", "prediction").toPandas().sort_values("row_id")
local = np.argmax(result.model.predict(np.stack(held_out["pixels"]).reshape(-1, 8, 8, 1), verbose=0), axis=1)
outcome["predict"] = {"rows": len(rows), "same_as_local": float(np.mean(rows["prediction"].to_numpy() == local))}

archive = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_gpus.sh")  # any existing file
try:
    tfbarrier.fit(spark.createDataFrame(train), digits_cnn(), features="pixels", label="digit",
                  env=tfbarrier.PythonEnv.from_archive(archive))
    outcome["archive"] = "accepted"
except ClusterError as exc:
    outcome["archive"] = str(exc)

print("RESULT " + json.dumps(outcome))
spark.stop()
