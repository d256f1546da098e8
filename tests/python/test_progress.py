"""Live progress and logs on the driver (progress.py), as a user sees them; training curves as pictures."""

import json
import socket

import cloudpickle
import psutil
import pytest
from conftest import digits_cnn, overshooting_line
from support import faults

import tfbarrier


def say_hello_from_worker_1():
    import os

    import tf_keras

    class Hello(tf_keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
                print("hello from worker 1", flush=True)

    return [Hello()]


def listening_ports():
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


@pytest.fixture(scope="module")
def verbose_fit(digits_df, tmp_path_factory):
    """A verbose=2 fit, with its driver output and the listening ports before and after."""
    import io
    import sys

    before = listening_ports()
    err, sys.stderr = sys.stderr, io.StringIO()
    try:
        result = tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", epochs=3, batch_size=64,
                               num_workers=2, verbose=2, callbacks=say_hello_from_worker_1,
                               tensorboard_dir=str(tmp_path_factory.mktemp("tensorboard")))
        output = sys.stderr.getvalue()
    finally:
        sys.stderr = err
    return result, output, before, listening_ports()


def test_progress_from_both_workers_arrives_while_training_runs(verbose_fit):
    result = verbose_fit[0]
    for worker in result.workers:
        updates = [m for m in result.progress if m["kind"] == "progress" and m["worker"] == worker["index"]]
        assert updates, f"no progress from worker {worker['index']}"
        assert min(m["received_at"] for m in updates) < worker["finished_at"]  # live, not at the end
    epochs = [m for m in result.progress if m["kind"] == "progress" and m["worker"] == 0 and "logs" in m]
    assert [m["epoch"] for m in epochs] == [0, 1, 2] and "loss" in epochs[0]["logs"]


def test_verbose_2_shows_every_workers_log_lines_and_a_progress_bar(verbose_fit):
    output = verbose_fit[1]
    assert "[worker 1] hello from worker 1" in output
    # Every task reached the driver, so the rendezvous went through it rather than Spark's allGather.
    assert "[worker 1] rendezvous: 2 workers through driver" in output
    assert "[worker 0] rendezvous: 2 workers through driver" in output
    assert "epoch 3: loss" in output and "step" in output


def test_the_progress_server_is_closed_after_fit(verbose_fit):
    _, _, before, after = verbose_fit
    assert after <= before


def test_tensorboard_logs_are_written_by_the_chief(verbose_fit, tmp_path_factory):
    import glob

    assert glob.glob(str(tmp_path_factory.getbasetemp() / "tensorboard*" / "**" / "events.out.tfevents.*"),
                     recursive=True)


def test_plot_writes_a_png_with_one_panel_per_metric(verbose_fit, tmp_path):
    path = tmp_path / "curves.png"
    figure = verbose_fit[0].plot(path)
    assert [axis.get_title() for axis in figure.axes] == ["loss", "accuracy"]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_history_frame_has_one_row_per_epoch(verbose_fit):
    frame = verbose_fit[0].history_frame()
    assert list(frame.columns) == ["loss", "accuracy"] and list(frame.index) == [1, 2, 3]


def test_when_no_task_reaches_the_driver_the_user_is_warned_that_progress_was_unavailable():
    from tfbarrier.spark.driver_link import DriverLink, DriverServer
    from tfbarrier.progress import ProgressDisplay, ProgressUnavailableWarning

    display = ProgressDisplay(verbose=1)
    server = DriverServer("127.0.0.1", on_message=display.show)
    with socket.socket() as closed:  # a port nobody listens on: what a firewall looks like to a task
        closed.bind(("127.0.0.1", 0))
        unreachable = {**server.endpoint, "port": closed.getsockname()[1]}
    link = DriverLink(unreachable, worker=0)
    link.event("started")  # no exception, no delay: training goes on
    link.send("progress", steps=1)
    link.close()
    server.close()
    with pytest.warns(ProgressUnavailableWarning, match="no progress reached the driver"):
        display.close(server)
    assert server.events == []


def global_batch_losses(steps):
    """The loss of each of the first ``steps`` global batches of overshooting_line on opposite_workers
    (conftest): ((w - 2)² + (w + 3)²) / 2 at the step's w, before the step w -= 1.2 (2w + 1), from w = 0."""
    w, losses = 0.0, []
    for _ in range(steps):
        losses.append(((w - 2) ** 2 + (w + 3) ** 2) / 2)
        w -= 1.2 * (2 * w + 1)
    return losses


def test_the_bars_loss_is_the_loss_keras_reports_for_the_global_batch(opposite_workers):
    # With 2 workers, tf_keras's per-batch logs add up both workers' running means: the bar showed ~2x.
    # Every worker's rows are alike (y = 2 on worker 0, y = -3 on worker 1), so each step's loss over the
    # global batch is known beforehand: the bar's loss after a step is their running mean over the epoch.
    expected = global_batch_losses(8)  # 6.5, 6.74, 7.2104, 8.132384, ...
    result = tfbarrier.fit(opposite_workers[0], overshooting_line, features="x", label="y", epochs=2, batch_size=8,
                           num_workers=2, steps_per_epoch=4, shuffle=False, callbacks=faults.slow_steps(1.05),
                           verbose=0)
    chief = [m for m in result.progress if m["kind"] == "progress" and m["worker"] == 0]
    for epoch in range(2):
        steps = [m for m in chief if "loss" in m and "epoch" not in m and epoch * 4 < m["steps"] <= (epoch + 1) * 4]
        assert steps and max(m["steps"] for m in steps) == (epoch + 1) * 4  # up to the epoch's last step
        for message in steps:  # the running loss after each step the bar showed
            so_far = expected[epoch * 4:message["steps"]]
            assert message["loss"] == pytest.approx(sum(so_far) / len(so_far), rel=1e-4), (epoch, message)
        epoch_loss = sum(expected[epoch * 4:(epoch + 1) * 4]) / 4
        epoch_end = [m for m in chief if m.get("epoch") == epoch]
        assert epoch_end[0]["loss"] == pytest.approx(epoch_loss, rel=1e-4)  # the bar ends the epoch on it
        assert result.history["loss"][epoch] == pytest.approx(epoch_loss, rel=1e-4)


def test_steps_and_progress_count_every_step_with_steps_per_execution(digits_df):
    """With steps_per_execution=4 Keras reports a batch end every 4 steps; the workers' step counts and
    the bar still count steps. The model is compiled with it, as a user does in Keras; fit passes on
    its CommunicationOptions, and each worker reports both as TensorFlow holds them."""
    model = digits_cnn()
    model.compile(optimizer=model.optimizer, loss=model.loss, metrics=["accuracy"], steps_per_execution=4)
    result = tfbarrier.fit(digits_df, model, features="pixels", label="digit", epochs=2, batch_size=64,
                           num_workers=2, steps_per_epoch=10, verbose=0,
                           exchange="strategy", communication={"bytes_per_pack": 1 << 20, "implementation": "ring"})
    assert [w["steps"] for w in result.workers] == [20, 20]
    assert [w["steps_per_execution"] for w in result.workers] == [4, 4]
    # read back from each worker's strategy and optimizer
    assert [w["communication"] for w in result.workers] == 2 * [
        {"exchange": "strategy", "implementation": "ring", "bytes_per_pack": 1 << 20, "timeout_seconds": None,
         "compression": "none"}]
    chief = [m for m in result.progress if m["kind"] == "progress" and m["worker"] == 0]
    assert chief[0]["total_steps"] == 20 and chief[-1]["steps"] == 20
    assert [m["steps"] for m in chief if "epoch" in m] == [10, 20]


def batch_ends(path):
    """A callbacks factory recording worker 0's batch-end indices in ``path``."""
    def factory():
        import json
        import os

        import tf_keras

        class Record(tf_keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
                    with open(path, "a") as f:
                        f.write(f"{batch}\n")

        return [Record()]

    return factory


def test_fits_steps_per_execution_takes_effect(digits_df, tmp_path):
    record = tmp_path / "batches"
    result = tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64,
                           steps_per_epoch=10, steps_per_execution=4, verbose=0, callbacks=batch_ends(str(record)))
    assert record.read_text().split() == ["3", "7", "9"]  # Keras ran 4, 4 and 2 steps per call
    assert [w["steps"] for w in result.workers] == [10, 10]


def batch_ends_in_calls_of(count, steps_per_epoch, epochs, measured_calls=10):
    """The batch indices Keras reports when the first ``measured_calls`` calls run one step each and the
    later ones ``count`` steps (an epoch's last call runs what is left of it)."""
    ends, call_steps = [], 0
    for _ in range(epochs):
        step = 0
        while step < steps_per_epoch:
            size = 1 if call_steps < measured_calls else min(count, steps_per_epoch - step)
            step, call_steps = step + size, call_steps + 1
            ends.append(step - 1)
    return ends


def test_auto_steps_per_execution_runs_about_half_a_second_per_call(digits_df, tmp_path):
    """fit's default steps_per_execution="auto": the calls after the first two are timed one step each,
    then every worker runs as many steps per call as last about 0.5 s. This small model's calls take
    milliseconds (30 steps per call unless the machine is very busy: at most an epoch); every step is
    counted."""
    record = tmp_path / "batches"
    result = tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", epochs=3, batch_size=64,
                           steps_per_epoch=30, verbose=0, callbacks=batch_ends(str(record)))
    counts = [w["steps_per_execution"] for w in result.workers]
    assert counts[0] == counts[1] and counts[0] > 1
    ends = [int(batch) for batch in record.read_text().split()]
    assert ends == batch_ends_in_calls_of(counts[0], steps_per_epoch=30, epochs=3)
    assert [w["steps"] for w in result.workers] == [90, 90]


def test_auto_steps_per_execution_follows_the_slowest_worker(digits_df, tmp_path):
    """Worker 1's batch ends take 0.2 s longer, and the other worker waits for it at each step's
    all-reduce: every worker adopts 0.5 / 0.2 = 2 steps per call at most, the same count everywhere
    (workers that grouped steps differently into calls would wait for each other forever)."""
    record = tmp_path / "batches"
    callbacks = lambda: batch_ends(str(record))() + faults.slow_steps(0.2, worker=1)()  # noqa: E731
    cloudpickle.register_pickle_by_value(faults)  # a helper module the callbacks use (docs/guides/training.md, "Your code on the workers")
    try:
        result = tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64,
                               steps_per_epoch=20, verbose=0, callbacks=callbacks)
    finally:
        cloudpickle.unregister_pickle_by_value(faults)
    counts = [w["steps_per_execution"] for w in result.workers]
    assert counts[0] == counts[1] and counts[0] <= 2
    ends = [int(batch) for batch in record.read_text().split()]
    assert ends == batch_ends_in_calls_of(counts[0], steps_per_epoch=20, epochs=1)
    assert [w["steps"] for w in result.workers] == [20, 20]


def test_steps_per_execution_none_keeps_the_models_own(digits_df):
    result = tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64,
                           steps_per_epoch=12, steps_per_execution=None, verbose=0)
    assert [w["steps_per_execution"] for w in result.workers] == [1, 1]
