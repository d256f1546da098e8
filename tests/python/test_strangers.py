"""No stranger gets in (issue 44): a process outside the job, with no secret and no Spark access,
tries what a plain TensorFlow client can do to a training process (read a file by placing
tf.io.read_file on /job:worker/task:N) against every port a training process listens on while a fit
trains. A fit over tfbarrier's ring (every fit on CPUs by default: a native Keras 3 model, a tf_keras model)
runs no TensorFlow server, and its training processes listen on no port once their ring is made (its
admission is tested in test_exchange.py): the stranger gets nothing, and the fit goes on unharmed. (A fit
under MultiWorkerMirroredStrategy, with GPUs or implementation "ring", has its server hand the file over:
README, "Security".)"""

import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import psutil
import pytest
import tf_keras
from conftest import training_processes as session_training_processes
from test_native import GLOBAL_BATCH, gated_model, line_data
from test_ring import RING, dense_model

import tfbarrier

STRANGER = r"""
import sys
import tensorflow as tf

port, path = sys.argv[1], sys.argv[2]
for task in (0, 1):
    with tf.Graph().as_default():
        with tf.device(f"/job:worker/task:{task}"):
            read = tf.io.read_file(path)
        config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=5000)
        try:
            with tf.compat.v1.Session(f"grpc://127.0.0.1:{port}", config=config) as session:
                print("READ", session.run(read).decode(), flush=True)
        except Exception as exc:
            print("REFUSED", type(exc).__name__, flush=True)
"""


def training_processes():
    """This session's adopted training processes (conftest's tag): not another test file's, which the other
    pytest-xdist worker may be running at the same time."""
    return [psutil.Process(pid) for pid in session_training_processes()]


def listening_ports(processes):
    ports = set()
    for process in processes:
        try:
            ports |= {c.laddr.port for c in process.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            pass
    return sorted(ports)


class Slowly(tf_keras.callbacks.Callback):  # Keras 3's fit takes tf_keras's callbacks too
    """Keeps a fit training for a while (0.3 s a step), so the stranger finds it at work."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.3)


@pytest.mark.parametrize("build, options", [(gated_model, {}), (dense_model, {"communication": RING})],
                         ids=["native_keras3", "tf_keras_over_the_ring"])
def test_a_stranger_gets_nothing_run_by_the_training_processes_of_a_fit_over_the_ring(spark, line_df, tmp_path,
                                                                                     build, options):
    marker = tmp_path / "marker.txt"
    marker.write_text("the executor's secrets")
    outcome = {}
    fit = threading.Thread(target=lambda: outcome.update(result=tfbarrier.fit(
        line_df, build(), features="x", label="y", epochs=1, batch_size=GLOBAL_BATCH, steps_per_epoch=40,
        num_workers=2, callbacks=lambda: [Slowly()], verbose=0, **options)))
    fit.start()
    deadline = time.monotonic() + 120
    while len(processes := training_processes()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(processes) == 2, "the fit's training processes did not start"
    time.sleep(3.0)  # past the ring's making: the processes train
    ports = listening_ports(processes)
    answers = [subprocess.run([sys.executable, "-c", STRANGER, str(port), str(marker)], capture_output=True,
                              text=True, timeout=120).stdout for port in ports]
    assert fit.is_alive(), "the fit ended before the stranger came: slow it more"
    fit.join(timeout=300)

    assert not any("READ" in answer for answer in answers), answers
    assert ports == [], "a training process over the ring listens on a port while it trains"
    result = outcome["result"]  # the fit went on unharmed
    assert [w["steps"] for w in result.workers] == [40, 40]
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    assert np.isfinite(result.history["loss"]).all()


@pytest.fixture(scope="module")
def line_df(spark):
    x, y = line_data()
    return spark.createDataFrame(pd.DataFrame({"x": list(x), "y": y})).repartition(2)
