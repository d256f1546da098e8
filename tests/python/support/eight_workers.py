"""Driver program for test_exchanges' many-worker fits on local[8]: a small tf_keras model fitted by 8 workers
from 8 partitions in order (no shuffle), and by 4 workers that each hold a quarter of Adam's state
(communication={"shard": "optimizer"}, clipped by the global norm, each gradient in a pack of its own: each
weight's updated values passed around the ring into the other workers' copies where they lie); each beside the same model fitted by one
process on the same global batches. Prints one JSON line: {fit: both histories, both final weights, each
worker's checksum and the weights whose optimizer state it held}."""

import json
import sys

import numpy as np
import pandas as pd
import tf_keras
from conftest import make_spark, partitioned

import tfbarrier

ROWS_PER_WORKER, GLOBAL_BATCH = 32, 64


def model(optimizer):
    tf_keras.utils.set_random_seed(5)
    built = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(8, activation="tanh"),
                                 tf_keras.layers.Dense(1)])
    built.compile(optimizer=optimizer(), loss="mse")
    return built


def beside_one_process(workers, optimizer, **fit_args):
    """``workers`` fit the model from as many partitions in order; one process fits it on the same global batches."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(workers * ROWS_PER_WORKER, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32") + 0.3).astype("float32")
    df = partitioned(spark, pd.DataFrame({"x": list(x), "y": y}), lambda i: i // ROWS_PER_WORKER, workers)
    result = tfbarrier.fit(df, model(optimizer), features="x", label="y", epochs=2, batch_size=GLOBAL_BATCH,
                           num_workers=workers, shuffle=False, **fit_args)
    share = GLOBAL_BATCH // workers  # each worker's rows a step, in rank order: one process's global batch
    order = np.concatenate([np.arange(w * ROWS_PER_WORKER + s, w * ROWS_PER_WORKER + s + share)
                            for s in range(0, ROWS_PER_WORKER, share) for w in range(workers)])
    reference = model(optimizer)
    history = reference.fit(x[order], y[order], batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0).history
    return {"loss": result.history["loss"], "reference_loss": history["loss"],
            "weights": [w.tolist() for w in result.model.get_weights()],
            "reference_weights": [w.tolist() for w in reference.get_weights()],
            "checksums": [w["checksum"] for w in result.workers],
            "state_of_weights": [w["communication"].get("state_of_weights") for w in result.workers],
            "parameters": reference.count_params()}


spark = make_spark("local[8]", **{"spark.pyspark.python": sys.executable})
print("RESULT " + json.dumps({
    "eight": beside_one_process(8, lambda: tf_keras.optimizers.SGD(0.05)),
    "four_sharded": beside_one_process(4, lambda: tf_keras.optimizers.Adam(0.05, global_clipnorm=0.5),
                                       communication={"shard": "optimizer", "bytes_per_pack": 4})}))
spark.stop()
