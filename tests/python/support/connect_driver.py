"""Driver program for test_connect: fit, run, apply, predict, a cancellation and a large result
through a local Spark Connect session (a process of its own: the test session already has a classic
SparkContext). Prints one JSON line."""

import hashlib
import json
import os
import tempfile
import time

import numpy as np
from conftest import digits_cnn, digits_frames, held_out_accuracy, training_processes
from pyspark.ml.functions import array_to_vector
from pyspark.sql import SparkSession
from spark_ml_pipeline import mlp
from test_apply import describe
from test_run import big_value, hang, tutorial_train

import tfbarrier
from tfbarrier.errors import ClusterError, JobTimeoutError
from tfbarrier.predicting.inference import predict_local
from tfbarrier.ml import KerasEstimator, KerasModel

spark = SparkSession.builder.remote("local[2]").getOrCreate()
train, held_out = digits_frames()
outcome = {"session": type(spark).__module__}

result = tfbarrier.fit(spark.createDataFrame(train), digits_cnn(), features="pixels", label="digit",
                       epochs=4, batch_size=64, num_workers=2, seed=1)
outcome["fit"] = {"accuracy": held_out_accuracy(result.model, held_out),
                  "checksums": [w["checksum"] for w in result.workers], "rows": [w["rows"] for w in result.workers],
                  "epochs": len(result.history["loss"]), "progress_from": sorted({m["worker"] for m in result.progress})}

outcome["run"] = tfbarrier.run(tutorial_train, num_workers=2, args=(1,), kwargs={"steps_per_epoch": 3}, spark=spark)

value = tfbarrier.run(big_value, num_workers=2, args=(24,), spark=spark)  # 24 MiB: several result rows
outcome["big_result"] = {"mib": len(value) / 2**20,
                         "same": hashlib.sha256(value).digest() == hashlib.sha256(big_value(24)).digest()}

applied = tfbarrier.apply(spark.createDataFrame(train.assign(x=1.0)[["x"]]), describe, num_workers=2)
outcome["apply"] = {"partitions": applied["partition"].tolist(), "rows": int(applied["rows"].sum()),
                    "addresses": int(applied["address"].nunique())}

started = time.time()
try:
    tfbarrier.run(hang, num_workers=2, timeout=20, spark=spark)
    outcome["cancel"] = {"error": None}
except JobTimeoutError as exc:
    raised = time.time() - started
    while training_processes() and time.time() - started < raised + 60:  # Spark kills Connect's tasks itself
        time.sleep(0.5)
    outcome["cancel"] = {"error": str(exc), "raised_after": raised, "left_behind": len(training_processes())}

held_out = held_out.assign(row_id=np.arange(len(held_out)))
scored = tfbarrier.predict(spark.createDataFrame(held_out).repartition(4), result.model, features="pixels")
rows = scored.select("row_id", "prediction").toPandas().sort_values("row_id")
local = np.argmax(result.model.predict(np.stack(held_out["pixels"]).reshape(-1, 8, 8, 1), verbose=0), axis=1)
outcome["predict"] = {"rows": len(rows), "same_as_local": float(np.mean(rows["prediction"].to_numpy() == local))}

# Spark ML: a vector column into a KerasEstimator, its model saved and loaded (pyspark.ml's own writer)
vectors = spark.createDataFrame(train).withColumn("vector", array_to_vector("pixels"))
trained = KerasEstimator(model=mlp(0.01), featuresCol="vector", labelCol="digit", epochs=2, batchSize=64,
                         verbose=0).fit(vectors)
with tempfile.TemporaryDirectory(prefix="connect-ml-") as directory:
    saved = os.path.join(directory, "model")
    trained.write().save(saved)
    first = vectors.limit(20)
    scored = [model.transform(first).select("prediction").toPandas()["prediction"].tolist()
              for model in (trained, KerasModel.load(saved))]
local = predict_local(trained.keras_model, np.stack(first.select("pixels").toPandas()["pixels"])).tolist()
outcome["spark_ml"] = {"epochs": len(trained.history["loss"]), "same_after_load": scored[0] == scored[1],
                       "same_as_local": scored[0] == [float(c) for c in local]}

archive = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_gpus.sh")  # any existing file
try:
    tfbarrier.fit(spark.createDataFrame(train), digits_cnn(), features="pixels", label="digit",
                  env=tfbarrier.PythonEnv.from_archive(archive))
    outcome["archive"] = "accepted"
except ClusterError as exc:
    outcome["archive"] = str(exc)

print("RESULT " + json.dumps(outcome))
spark.stop()
