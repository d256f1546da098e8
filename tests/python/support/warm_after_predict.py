"""Driver program for test_spares: on a local[2] Spark of its own whose Python workers are reused (Spark's
default), a fit, a predict, a fit. Predict imports TensorFlow in the Python workers, which writes into
their environment; the second fit must still be served by the keeper the first one left. Prints one
JSON line."""

import json
import time

from conftest import digits_cnn, digits_frames, make_spark, training_processes

import tfbarrier

spark = make_spark("local[2]")
df = spark.createDataFrame(digits_frames()[0]).repartition(2).cache()
df.count()
report = {"warm": [], "keepers": []}
for step in ("fit", "predict", "fit"):
    if step == "predict":
        report["scored"] = len(tfbarrier.predict(df, model, features="pixels").select("prediction").collect())
        continue
    result = tfbarrier.fit(df, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64)
    model = result.model
    report["warm"].append([worker["warm_start"] for worker in result.workers])
    deadline = time.monotonic() + 60
    while not training_processes(kind="keeper") and time.monotonic() < deadline:
        time.sleep(0.05)  # a task starts its keeper after it ends
    report["keepers"].append(sorted(training_processes(kind="keeper")))
print("RESULT " + json.dumps(report), flush=True)
spark.stop()
