"""Data-parallel training computes what single-process training computes: with plain SGD and a
fixed data order, a 2-worker fit and one tf_keras process fed the same global batches end with the
same weights and report the same epoch metrics, with several steps per call into TensorFlow too, and with
packs of 4 kB (the first kernel's 8 kB gradient all-reduced in two pieces); and
with communication={"compression": "fp16"} the workers sum their gradients as float16 holds them."""

import numpy as np
import pandas as pd
import pytest
from conftest import partitioned, worker_model

import tfbarrier

ROWS_PER_WORKER = 512
GLOBAL_BATCH = 64


def dense_model():
    import keras

    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


@pytest.mark.parametrize("speed", [{}, {"steps_per_execution": 5, "communication": {"bytes_per_pack": 1 << 12}}],
                         ids=["defaults", "steps_per_execution_and_packing"])
def test_two_workers_and_one_process_end_with_the_same_weights(spark, digits, speed):
    train = digits[0].iloc[: 2 * ROWS_PER_WORKER].reset_index(drop=True)
    df = partitioned(spark, train, lambda i: int(i >= ROWS_PER_WORKER), 2)  # worker 0: rows [0, 512)
    model = dense_model()
    result = tfbarrier.fit(df, model, features="pixels", label="digit", epochs=2, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False, **speed)

    # The same global batches in one process: step i takes rows [32i, 32i+32) of each worker's shard.
    x = np.stack(train["pixels"].to_numpy()).astype("float32")
    y = train["digit"].to_numpy()
    half = GLOBAL_BATCH // 2
    order = np.concatenate([np.r_[i:i + half, ROWS_PER_WORKER + i:ROWS_PER_WORKER + i + half]
                            for i in range(0, ROWS_PER_WORKER, half)])
    reference = worker_model(model)  # tf_keras, same initial weights and optimizer
    history = reference.fit(x[order], y[order], batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0).history

    assert result.workers[0]["steps"] == 2 * (2 * ROWS_PER_WORKER // GLOBAL_BATCH)
    for trained, expected in zip(result.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(trained, expected, rtol=1e-4, atol=1e-6)
    assert not np.allclose(result.model.get_weights()[0], model.get_weights()[0])  # training moved them
    # The metrics count every step, also those whose results no call returned (pacing.looping_train_function).
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose(result.history[name], history[name], rtol=1e-4)


def compression_model(optimizer):
    """w·x with w = 0, trained by one step of SGD(1) on MAE towards 10: the step adds the mean of x to w."""
    def build():
        import tf_keras

        model = tf_keras.Sequential([tf_keras.Input((1,)),
                                     tf_keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
        model.compile(optimizer=optimizer(), loss="mae")
        return model
    return build


@pytest.mark.parametrize("compression, optimizer, expected", [
    ("none", "SGD", 1 + 2**-12),
    ("fp16", "SGD", 1.0),
    ("fp16", "legacy", 1.0),
])
def test_fp16_compression_all_reduces_the_gradients_in_float16(spark, compression, optimizer, expected):
    # x = 1 + 2**-12 on every row: each worker's gradient, -(1 + 2**-12) / 2, is exact in float32 and
    # rounds to -0.5 in float16 (whose spacing there is 2**-11), so the update tells which was summed.
    import tf_keras

    sgd = {"SGD": lambda: tf_keras.optimizers.SGD(1.0), "legacy": lambda: tf_keras.optimizers.legacy.SGD(1.0)}
    frame = pd.DataFrame({"x": [[1 + 2**-12]] * 4, "y": [10.0] * 4})
    df = partitioned(spark, frame, lambda i: i // 2, 2)
    result = tfbarrier.fit(df, compression_model(sgd[optimizer]), features="x", label="y", epochs=1, batch_size=4,
                           num_workers=2, shuffle=False, communication={"compression": compression})

    assert result.workers[0]["steps"] == 1
    assert [w["communication"]["compression"] for w in result.workers] == [compression, compression]  # the hooks
    assert result.model.get_weights()[0].item() == expected
