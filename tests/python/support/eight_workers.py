"""Driver program for test_exchange's 8-worker fit: a small tf_keras model fitted by 8 workers on local[8]
from 8 partitions in order (no shuffle), and the same model fitted by one process on the same global
batches. Prints one JSON line: both histories, both final weights, and each worker's checksum."""

import json
import sys

import numpy as np
import pandas as pd
import tf_keras
from conftest import make_spark, partitioned

import tfbarrier

WORKERS, ROWS_PER_WORKER, GLOBAL_BATCH = 8, 32, 64


def model():
    tf_keras.utils.set_random_seed(5)
    built = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(8, activation="tanh"),
                                 tf_keras.layers.Dense(1)])
    built.compile(optimizer=tf_keras.optimizers.SGD(0.05), loss="mse")
    return built


spark = make_spark(f"local[{WORKERS}]", **{"spark.pyspark.python": sys.executable})
rng = np.random.default_rng(1)
x = rng.normal(size=(WORKERS * ROWS_PER_WORKER, 4)).astype("float32")
y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32") + 0.3).astype("float32")
df = partitioned(spark, pd.DataFrame({"x": list(x), "y": y}), lambda i: i // ROWS_PER_WORKER, WORKERS)
result = tfbarrier.fit(df, model(), features="x", label="y", epochs=2, batch_size=GLOBAL_BATCH,
                       num_workers=WORKERS, shuffle=False)
share = GLOBAL_BATCH // WORKERS  # each worker's rows a step, in rank order: one process's global batch
order = np.concatenate([np.arange(w * ROWS_PER_WORKER + s, w * ROWS_PER_WORKER + s + share)
                        for s in range(0, ROWS_PER_WORKER, share) for w in range(WORKERS)])
reference = model()
history = reference.fit(x[order], y[order], batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0).history
print("RESULT " + json.dumps({
    "loss": result.history["loss"], "reference_loss": history["loss"],
    "weights": [w.tolist() for w in result.model.get_weights()],
    "reference_weights": [w.tolist() for w in reference.get_weights()],
    "checksums": [w["checksum"] for w in result.workers]}))
spark.stop()
