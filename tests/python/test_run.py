"""run(): any training function in every barrier task, TF_CONFIG already set."""

import pytest

import tfbarrier
from tfbarrier.errors import InvalidArgumentError


def tutorial_train(epochs, steps_per_epoch):
    """TensorFlow's multi-worker Keras tutorial, shrunk: reads TF_CONFIG and builds its own strategy."""
    import json
    import os

    import numpy as np
    import tensorflow as tf

    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(tf_config["task"]["index"])
    x = rng.random((256, 28, 28)).astype("float32")
    y = rng.integers(0, 10, 256)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256).repeat().batch(16 * num_workers)
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.layers.InputLayer(input_shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(8, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(10),
        ])
        model.compile(
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
            metrics=["accuracy"],
        )
    history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0)
    return {
        "index": tf_config["task"]["index"],
        "workers": num_workers,
        "replicas": strategy.num_replicas_in_sync,
        "loss": history.history["loss"],
    }


def big_value(mib):
    """``mib`` MiB of bytes, the same on every call: a result larger than one 16 MiB result row."""
    import numpy as np

    return np.random.default_rng(mib).bytes(mib * 2**20)


def hang():
    import time

    time.sleep(3600)


def test_run_executes_the_tutorial_function_and_returns_the_chiefs_value(spark):
    value = tfbarrier.run(tutorial_train, num_workers=2, args=(2,), kwargs={"steps_per_epoch": 5})
    assert value["index"] == 0
    assert value["workers"] == 2 and value["replicas"] == 2
    assert len(value["loss"]) == 2


def test_run_refuses_what_is_not_a_function(spark):
    with pytest.raises(InvalidArgumentError, match="train_fn must be a function"):
        tfbarrier.run("train.py", num_workers=2)


def test_a_result_larger_than_one_result_row_arrives_whole(spark):
    value = tfbarrier.run(big_value, num_workers=2, args=(40,), spark=spark, verbose=0)
    assert len(value) == 40 * 2**20 and value == big_value(40)  # 3 rows of at most 16 MiB


def test_a_module_the_user_registered_by_value_stays_registered():
    """cloudpickle's register_pickle_by_value is how a user ships helper modules of their own (docs/guides/training.md).
    tfbarrier unregistered such a module after shipping a function of it, so that the next function
    using the helpers failed in the training processes with "No module named 'support'"."""
    import contextlib
    import subprocess
    import sys

    import cloudpickle
    from support import faults

    from tfbarrier.user_code import pickle_user_code

    cloudpickle.register_pickle_by_value(faults)
    try:
        pickle_user_code(faults.slow_steps(0), faults.slow_steps(0))  # a fit with the helpers' callbacks
        later = cloudpickle.dumps(lambda: faults.slow_steps(0, worker=1))  # the next one's, from elsewhere
    finally:
        with contextlib.suppress(ValueError):  # "not registered": what the bug left
            cloudpickle.unregister_pickle_by_value(faults)
    load = "import cloudpickle, sys; cloudpickle.loads(sys.stdin.buffer.read())()"  # where support is not importable
    loaded = subprocess.run([sys.executable, "-c", load], input=later, capture_output=True, cwd="/",
                            env={"PATH": "/usr/bin:/bin"})
    assert loaded.returncode == 0, loaded.stderr.decode()
