"""tf_keras models over tfbarrier's authenticated ring (exchange "tfbarrier", the default of every fit of at
most one GPU per worker): no MultiWorkerMirroredStrategy and no TensorFlow server. Two workers end with the weights and history of one tf_keras process fed the same global
batches, validation counts every row once, saved models and a mid-epoch resume work as under the
strategy."""

import numpy as np
import pandas as pd
import pytest
from conftest import partitioned
from test_native import (GLOBAL_BATCH, line_df, one_process,  # noqa: F401 - line_df: a fixture
                         resumes_as_if_uninterrupted, trained_as_one_process)

import tfbarrier

def dense_model(seed=11):
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    model = tf_keras.Sequential([tf_keras.Input((8,)), tf_keras.layers.Dense(16, activation="tanh"),
                                 tf_keras.layers.Dense(1)])
    model.compile(optimizer=tf_keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


def test_two_workers_train_a_tf_keras_model_over_the_ring_as_one_process_would(spark, line_df, tmp_path):  # noqa: F811
    import tf_keras

    model, reference = dense_model(), dense_model()
    result = tfbarrier.fit(line_df, model, features="x", label="y", epochs=2, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False, exchange="tfbarrier", steps_per_execution=2,
                           save_to=str(tmp_path), verbose=0)
    history = one_process(reference, epochs=2)

    assert result.workers[0]["steps_per_execution"] == 2
    assert isinstance(result.model, tf_keras.Model)
    trained_as_one_process(result, model, reference, history)
    saved = tf_keras.models.load_model(tmp_path / "epoch-002.keras")
    for trained, kept in zip(result.model.get_weights(), saved.get_weights()):
        np.testing.assert_array_equal(trained, kept)


@pytest.mark.parametrize("exchange", ["tfbarrier", "strategy"])
def test_a_label_per_row_validates_as_in_one_process_however_uneven_the_workers_shares(spark, line_df,  # noqa: F811
                                                                                       exchange):
    # y is one float per row against one prediction column: the loss of each row, not the batch's mean
    # (under the strategy too: its val_loss was 2.04 for one process's 2.30)
    reference = dense_model()
    rng = np.random.default_rng(4)
    xv = rng.normal(size=(41, 8)).astype("float32")
    yv = (xv @ np.linspace(-1, 1, 8)).astype("float32")
    validation = partitioned(spark, pd.DataFrame({"x": list(xv), "y": yv}), lambda i: int(i >= 30), 2)
    result = tfbarrier.fit(line_df, dense_model(), features="x", label="y", epochs=2, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False, validation_data=validation, exchange=exchange,
                           verbose=0)
    history = one_process(reference, epochs=2, validation_data=(xv, yv))
    for name in ("val_loss", "val_mae", "loss", "mae"):
        np.testing.assert_allclose(result.history[name], history[name], rtol=1e-4, err_msg=name)


def test_a_ring_worker_killed_mid_epoch_resumes_at_the_next_step_as_if_uninterrupted(spark, line_df,  # noqa: F811
                                                                                      tmp_path):
    def fit(**kwargs):
        return tfbarrier.fit(line_df, dense_model(), features="x", label="y", epochs=3, batch_size=GLOBAL_BATCH,
                             num_workers=2, seed=7, verbose=0, exchange="tfbarrier", **kwargs)

    resumes_as_if_uninterrupted(fit, tmp_path)
