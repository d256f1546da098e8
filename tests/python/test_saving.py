"""fit(save_to=) (saving.py): the chief saves the model while it trains, in the user's Keras, every
epoch or the best by a metric, and the archives outlive the driver."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import digits_cnn, overshooting_line, training_processes

import tfbarrier
from tfbarrier.errors import InvalidArgumentError
from tfbarrier.spark import workdirs


def pixels(frame):
    return np.stack(frame["pixels"].to_numpy()).reshape(-1, 8, 8, 1).astype("float32")


def test_save_best_keeps_the_model_of_the_best_validation_epoch(spark, digits, tmp_path):
    import keras

    train, held_out = digits
    result = tfbarrier.fit(spark.createDataFrame(train), digits_cnn(), features="pixels", label="digit", epochs=4,
                           batch_size=64, seed=1, verbose=0, validation_data=spark.createDataFrame(held_out),
                           save_to=str(tmp_path), save_best="val_loss")
    losses = result.history["val_loss"]
    improved = [epoch + 1 for epoch, loss in enumerate(losses) if loss < min(losses[:epoch], default=np.inf)]
    assert [s["epoch"] for s in result.saved] == improved
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "saved.json"]
    manifest = json.loads((tmp_path / "saved.json").read_text())
    assert [m["logs"]["val_loss"] for m in manifest] == [losses[e - 1] for e in improved]
    best = keras.saving.load_model(tmp_path / "best.keras")  # a Keras 3 archive, as the model passed in
    local = best.evaluate(pixels(held_out), held_out["digit"].to_numpy(), batch_size=len(held_out), verbose=0)
    assert local[0] == pytest.approx(min(losses), abs=1e-4)


@pytest.mark.parametrize("save_mode, saved, best_weight", [
    ("auto", [1], -1.2),  # val_loss: lower is better
    ("min", [1], -1.2),
    ("max", [1, 2, 3], -1.872),
])
def test_save_best_saves_only_improvements_in_its_mode(opposite_workers, tmp_path, save_mode, saved, best_weight):
    """val_loss rises every epoch (6.74, 7.2104, 8.1324, see conftest.opposite_workers): "min" keeps the
    first epoch's model alone, "max" replaces it every epoch."""
    import tf_keras

    training, validation = opposite_workers
    result = tfbarrier.fit(training, overshooting_line, features="x", label="y", epochs=3, batch_size=8,
                           steps_per_epoch=1, shuffle=False, validation_data=validation, verbose=0,
                           save_to=str(tmp_path), save_best="val_loss", save_mode=save_mode)
    assert [s["epoch"] for s in result.saved] == saved
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "saved.json"]
    best = tf_keras.models.load_model(tmp_path / "best.keras")
    assert best.get_weights()[0].item() == pytest.approx(best_weight, rel=1e-5)


def build_tf_keras_cnn():
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_save_to_keeps_every_epoch_of_a_model_functions_fit(digits_df, digits, tmp_path):
    import tf_keras

    result = tfbarrier.fit(digits_df, build_tf_keras_cnn, features="pixels", label="digit", epochs=2,
                           batch_size=64, verbose=0, save_to=str(tmp_path / "models"))
    assert [s["epoch"] for s in result.saved] == [1, 2]
    assert sorted(os.listdir(tmp_path / "models")) == ["epoch-001.keras", "epoch-002.keras", "saved.json"]
    x = pixels(digits[1]).reshape(-1, 64)
    first, last = (tf_keras.models.load_model(s["path"]).predict(x, verbose=0) for s in result.saved)
    np.testing.assert_allclose(last, result.model.predict(x, verbose=0), atol=1e-6)
    assert not np.allclose(first, last)


def test_saved_models_outlive_a_killed_driver(tmp_path):
    """A driver killed mid-fit leaves the archives saved so far, whole and loadable, and no process; the
    directories it could not remove are the next start's sweep's (in a temporary directory of its own, so that
    the suite's end counts none: tests/leftovers.py)."""
    import keras

    here = os.path.dirname(os.path.abspath(__file__))
    scratch = tmp_path / "tmp"
    scratch.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p),
           "TMPDIR": str(scratch)}
    driver = subprocess.Popen([sys.executable, os.path.join(here, "support", "saving_driver.py"), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=here, env=env)
    try:
        tag = json.loads(driver.stdout.readline().removeprefix("STARTED "))["tag"]
        deadline = time.monotonic() + 300
        while not (tmp_path / "epoch-002.keras").exists():
            assert driver.poll() is None and time.monotonic() < deadline, "the driver saved no second epoch"
            time.sleep(0.2)
        assert training_processes(tag=tag), "the fit should still be training"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    model = keras.saving.load_model(tmp_path / "epoch-001.keras")
    assert model.predict(np.zeros((1, 8, 8, 1), "float32"), verbose=0).shape == (1, 10)
    deadline = time.monotonic() + 60
    while training_processes(tag=tag) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert training_processes(tag=tag) == []
    left = workdirs.leftovers(str(scratch))
    assert left, "a driver killed mid-fit leaves its job's directory"
    assert sorted(workdirs.sweep(str(scratch), force=True)) == sorted(left) and workdirs.leftovers(str(scratch)) == []


@pytest.mark.parametrize("kwargs, message", [
    ({"save_best": "val_loss"}, "save_best='val_loss' needs save_to="),
    ({"save_to": "DIR", "save_best": "val_loss"}, "is a validation metric: pass validation_data="),
    ({"save_to": "DIR", "save_best": 3}, "save_best must be the name of a metric"),
    ({"save_to": "DIR", "save_best": "loss", "save_mode": "lowest"}, "save_mode must be 'auto', 'min' or 'max'"),
    ({"save_to": "DIR", "save_mode": "lowest"}, "save_mode must be 'auto', 'min' or 'max'"),
])
def test_bad_save_arguments_are_refused_on_the_driver(digits_df, tmp_path, kwargs, message):
    kwargs = {k: str(tmp_path) if v == "DIR" else v for k, v in kwargs.items()}
    with pytest.raises(InvalidArgumentError, match=message):
        tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", **kwargs)
