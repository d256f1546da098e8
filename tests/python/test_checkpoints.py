"""fit(checkpoint_dir=, checkpoint_every=): a fit that failed resumes at the step after the last save,
with every worker's data where it left off, so that it ends as an uninterrupted fit would: the same
history, the same weights."""

import numpy as np
import pytest
from conftest import digits_cnn, left_behind
from support import faults

import tfbarrier
from tfbarrier.errors import InvalidArgumentError


def normalized_mlp():
    """A model with BatchNormalization, whose moving statistics are all-reduced when read: every worker
    takes part in a checkpoint's save."""
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(10)])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit(df, build=digits_cnn, **kwargs):
    """The same fit every time: the same initial weights (a model object brings its own) and data order."""
    import keras

    keras.utils.set_random_seed(1)
    args = dict(features="pixels", label="digit", epochs=2, batch_size=64, num_workers=2, seed=7,
                steps_per_execution=1, verbose=0)
    return tfbarrier.fit(df, build(), **{**args, **kwargs})


@pytest.fixture(scope="module")
def uninterrupted(digits_df):
    return fit(digits_df)


def assert_same_training(result, uninterrupted):
    for name, values in uninterrupted.history.items():
        np.testing.assert_allclose(result.history[name], values, rtol=1e-5, err_msg=name)
    for trained, expected in zip(result.model.get_weights(), uninterrupted.model.get_weights()):
        np.testing.assert_allclose(trained, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("exchange", ["tfbarrier", "strategy"])
def test_a_worker_killed_mid_epoch_resumes_at_the_next_step_as_if_uninterrupted(digits_df, uninterrupted, tmp_path,
                                                                                 exchange):
    # tfbarrier's ring by default; MultiWorkerMirroredStrategy with TensorFlow's RING collective
    communication = {"implementation": "ring"} if exchange == "strategy" else None
    if exchange == "strategy":
        uninterrupted = fit(digits_df, exchange=exchange, communication=communication)
    steps = uninterrupted.workers[0]["steps_per_epoch"]
    result = fit(digits_df, checkpoint_dir=str(tmp_path), checkpoint_every=1, max_retries=1,
                 callbacks=faults.kill_after_step(worker=1, epoch=1, step=5), exchange=exchange,
                 communication=communication)
    first, second = result.attempts
    assert "killed by signal SIGKILL" in first["error"]
    assert second["resumed_at"] == {"epoch": 1, "step": 6, "steps_done": steps + 6}
    assert [w["steps"] for w in result.workers] == [steps - 6] * 2  # only the rest of epoch 1 ran again
    assert_same_training(result, uninterrupted)
    assert not (tmp_path / "state").exists()  # a finished fit leaves nothing to resume
    assert left_behind() == []


def test_a_fit_resumed_from_an_epoch_checkpoint_continues_the_data_where_it_stopped(digits_df, uninterrupted,
                                                                                     tmp_path):
    # Without checkpoint_every the save is at the epoch's end; the shards' stream goes on from there
    # rather than from their first rows (which the earlier code fed the resumed epoch again).
    result = fit(digits_df, checkpoint_dir=str(tmp_path), max_retries=1,
                 callbacks=faults.kill_after_step(worker=0, epoch=1, step=3))
    assert result.attempts[1]["resumed_at"]["epoch"] == 1 and result.attempts[1]["resumed_at"]["step"] == 0
    assert_same_training(result, uninterrupted)


def test_a_model_with_batch_normalization_resumes_mid_epoch_as_if_uninterrupted(digits_df, tmp_path):
    uninterrupted = fit(digits_df, build=normalized_mlp)
    result = fit(digits_df, build=normalized_mlp, checkpoint_dir=str(tmp_path), checkpoint_every=4, max_retries=1,
                 callbacks=faults.kill_after_step(worker=0, epoch=0, step=9))
    assert result.attempts[1]["resumed_at"] == {"epoch": 0, "step": 8, "steps_done": 8}  # the save after step 8
    assert_same_training(result, uninterrupted)


def test_a_duration_checkpoint_every_saves_within_epochs_and_resumes_there_as_if_uninterrupted(digits_df, uninterrupted,
                                                                                              tmp_path):
    # In seconds, the workers agree at their CHECKPOINT_DECIDE_AT_CALL-th call how many steps the duration
    # comes to on the slowest of them (its first call's trace included): 0.2 s is one step or a few here,
    # far fewer than the 24 + 6 steps run before the kill, so the resumed fit starts within epoch 1. A seconds
    # mode that never saves within an epoch would resume at its start (step 0), and end the same.
    steps = uninterrupted.workers[0]["steps_per_epoch"]
    result = fit(digits_df, checkpoint_dir=str(tmp_path), checkpoint_every="0.2s", max_retries=1,
                 callbacks=faults.kill_after_step(worker=1, epoch=1, step=5))
    first, second = result.attempts
    assert "killed by signal SIGKILL" in first["error"]
    resumed = second["resumed_at"]
    assert resumed["epoch"] == 1 and 0 < resumed["step"] <= 6, resumed  # a save within epoch 1, at step 5 or before
    assert resumed["steps_done"] == steps + resumed["step"]
    # the resumed attempt decided its own pace and saved within the epoch too, not only at its end
    assert all(w["checkpoint_saves"] > 1 for w in result.workers), [w["checkpoint_saves"] for w in result.workers]
    assert_same_training(result, uninterrupted)
    assert not (tmp_path / "state").exists()
    assert left_behind() == []


def test_checkpoint_every_needs_a_directory_and_a_number_or_a_duration(digits_df):
    with pytest.raises(InvalidArgumentError, match="needs checkpoint_dir"):
        fit(digits_df, checkpoint_every=10)
    for wrong in (0, "soon", "-5s", 2.5, True):
        with pytest.raises(InvalidArgumentError, match="number of steps or a duration"):
            fit(digits_df, checkpoint_dir="/tmp", checkpoint_every=wrong)
