"""No stranger gets in (issue 44): a process outside the job, with no secret and no Spark access,
tries what a plain TensorFlow client can do to a training process (support/stranger.py: read a file by
placing tf.io.read_file on /job:worker/task:N) against every port a training process listens on while a
fit trains. A fit over tfbarrier's ring (every fit on CPUs by default: a native Keras 3 model, a tf_keras
model) runs no TensorFlow server, and its training processes listen on no port once their ring is made (its
admission is tested in test_exchange.py): the stranger gets nothing, and the fit goes on unharmed. The same
stranger reads the file through a fit under MultiWorkerMirroredStrategy (exchange "strategy": what every
fit was before the ring), so the test can see what it looks for. test_hosts.py does the same across hosts."""

import os
import threading
import time

import numpy as np
import pandas as pd
import pytest
import tf_keras
from conftest import training_processes
from test_native import GLOBAL_BATCH, gated_model, line_data
from test_ring import dense_model

from support import stranger

import tfbarrier

SECRET = "the executor's secrets"
STEPS = 5


class HeldWhile(tf_keras.callbacks.Callback):  # Keras 3's fit takes tf_keras's callbacks too
    """Holds the fit after a step while the file ``path`` exists (at most 120 s), so the stranger finds it at
    work: its ring made, its processes training."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_train_batch_end(self, batch, logs=None):
        deadline = time.monotonic() + 120
        while os.path.exists(self.path) and time.monotonic() < deadline:
            time.sleep(0.1)


@pytest.mark.parametrize("build, options, over_ring", [
    (gated_model, {}, True), (dense_model, {"exchange": "tfbarrier"}, True),
    (dense_model, {"exchange": "strategy", "communication": {"implementation": "ring"}}, False)],
    ids=["native_keras3", "tf_keras_over_the_ring", "tf_keras_under_the_strategy"])
def test_a_stranger_gets_nothing_run_by_the_training_processes_of_a_fit_over_the_ring(spark, line_df, tmp_path,
                                                                                     build, options, over_ring):
    marker, hold = tmp_path / "marker.txt", str(tmp_path / "hold")
    marker.write_text(SECRET)
    open(hold, "w").close()
    outcome = {}
    fit = threading.Thread(target=lambda: outcome.update(result=tfbarrier.fit(
        line_df, build(), features="x", label="y", epochs=1, batch_size=GLOBAL_BATCH, steps_per_epoch=STEPS,
        num_workers=2, callbacks=lambda: [HeldWhile(hold)], verbose=0, **options)))
    fit.start()
    deadline = time.monotonic() + 120
    # this session's adopted training processes (conftest's tag), not the other pytest-xdist worker's
    while len(processes := training_processes()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(processes) == 2, "the fit's training processes did not start"
    time.sleep(3.0)  # past the ring's making: the processes train
    ports = stranger.listening_ports(processes)
    answers = stranger.attempt("127.0.0.1", ports, str(marker))
    assert fit.is_alive(), "the fit ended before the stranger came"
    os.remove(hold)
    fit.join(timeout=300)

    if over_ring:
        assert not any("READ" in answer for answer in answers), answers
        assert ports == [], "a training process over the ring listens on a port while it trains"
    else:  # the strategy's servers listen, and hand the file over
        assert ports and any(f"READ {SECRET}" in answer for answer in answers), answers
    result = outcome["result"]  # the fit went on unharmed
    assert [w["steps"] for w in result.workers] == [STEPS, STEPS]
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    assert np.isfinite(result.history["loss"]).all()


@pytest.fixture(scope="module")
def line_df(spark):
    x, y = line_data()
    return spark.createDataFrame(pd.DataFrame({"x": list(x), "y": y})).repartition(2)
