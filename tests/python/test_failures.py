"""Failure semantics: fail fast, never hang, leave nothing behind, resume from checkpoints."""

import json
import socket
import time

import pytest
from conftest import digits_cnn, left_behind, session_listeners
from support import faults

import tfbarrier
from tfbarrier.errors import JobTimeoutError, WorkerError, WorkerStalledError


def fit(df, **kwargs):
    args = dict(features="pixels", label="digit", epochs=3, batch_size=64, num_workers=2)
    args.update(kwargs)
    return tfbarrier.fit(df, digits_cnn(), **args)


@pytest.mark.versions
def test_a_worker_error_fails_the_fit_fast_with_its_details_and_leaves_nothing_behind(digits_df, tmp_path):
    note = tmp_path / "fault.json"
    with pytest.raises(WorkerError) as failure:
        fit(digits_df, callbacks=faults.raise_error(worker=1, epoch=1, note=str(note)), max_retries=2)
    raised_at = time.time()
    fault = json.loads(note.read_text())
    error = failure.value
    assert raised_at - fault["at"] < 60
    assert error.worker == 1 and error.host and error.exc_type == "ValueError" and not error.retryable
    assert "worker 1 on" in str(error) and "ValueError: injected failure in worker 1 at epoch 1" in str(error)
    assert "injected failure" in error.log  # the worker's own traceback, from its output
    assert "absl::InitializeLog" not in error.log and "oneDNN" not in error.log  # TensorFlow's banners
    assert left_behind() == []
    assert session_listeners(fault["workers"]) == []
    assert error.attempts == [{"attempt": 1, "error": str(error).splitlines()[0].join(["WorkerError: ", ""]),
                               "retryable": False}]


@pytest.mark.parametrize("steps_per_execution", [None, 4])
def test_a_hanging_worker_is_caught_by_the_stall_watchdog_which_shows_where_it_stood(digits_df,
                                                                                     steps_per_execution):
    started = time.time()
    with pytest.raises(WorkerStalledError, match="made no progress for 8 s") as failure:
        fit(digits_df, callbacks=faults.hang(worker=1, epoch=1), stall_timeout=8, steps_per_execution=steps_per_execution)
    assert time.time() - started < 90
    # Worker 1 sleeps in the fault's callback, worker 0 waits for it in the step's collective: either's
    # watchdog may fire first, and the stacks that end its log show which one it was. Worker 0's ring times out
    # after the same 8 s: when that came first, its traceback, printed as the stacks were dumped, shows where it
    # stood (a clean-clone run saw it: the dump's main thread was printing the ring's PeerLostError).
    error = failure.value
    assert error.worker in (0, 1) and f"worker {error.worker} on {error.host} made no progress" in str(error)
    starts = [error.log.find(mark) for mark in ("Traceback (most recent call last)", "(most recent call first)")]
    stacks = error.log[min(start for start in starts if start >= 0):]
    assert " in fit" in stacks and (" in act" in stacks) == (error.worker == 1)
    assert left_behind() == []


def test_when_retries_run_out_the_last_error_is_raised_with_every_attempt(digits_df):
    with pytest.raises(WorkerError, match="killed by signal SIGKILL") as failure:
        fit(digits_df, epochs=2, callbacks=faults.kill_always(worker=1, epoch=0), max_retries=1, verbose=0)
    attempts = failure.value.attempts
    assert [a["attempt"] for a in attempts] == [1, 2] and all(a["retryable"] for a in attempts)
    assert all("killed by signal SIGKILL" in a["error"] for a in attempts)
    assert left_behind() == []


def test_a_slow_but_healthy_fit_outlives_a_short_stall_timeout(digits_df):
    # The negative control of the stall watchdog: training lasts over twice its stall_timeout in all.
    result = fit(digits_df, epochs=3, steps_per_epoch=8, callbacks=faults.slow_steps(0.75), stall_timeout=8, verbose=0)
    assert len(result.history["loss"]) == 3 and result.workers[0]["steps"] == 24
    assert result.timings["training"] > 2 * 8


def test_the_stall_watchdog_counts_from_the_first_step(digits_df):
    """Set-up sends nothing (strategy, model build, first trace): the watchdog used to count from CONFIG,
    so a set-up longer than stall_timeout on a loaded machine failed a healthy fit (the slow-but-healthy
    test's flake). A callback factory that takes 12 s stands in for a slow set-up."""
    result = fit(digits_df, epochs=1, steps_per_epoch=4, callbacks=faults.slow_setup(12), stall_timeout=8,
                 verbose=0)
    assert [w["steps"] for w in result.workers] == [4, 4]


def test_the_stall_watchdog_waits_out_the_end_of_a_fit(digits_df):
    """After the last step, fit can take longer than stall_timeout to return: tf_keras deletes its data
    iterator, which waits for a tf.data thread, seconds and longer the longer the fit ran (it made the
    test above fail now and then: worker 1 finished, worker 0 was declared stalled). A callback slow at
    the end of training stands in for that wait."""
    result = fit(digits_df, epochs=1, steps_per_epoch=4, callbacks=faults.slow_train_end(12), stall_timeout=8,
                 verbose=0)
    assert [w["steps"] for w in result.workers] == [4, 4]
    assert result.timings["training"] > 12


def test_timeout_cancels_the_whole_fit(digits_df):
    started = time.time()
    with pytest.raises(JobTimeoutError, match="ran past its timeout of 15 s"):
        fit(digits_df, callbacks=faults.hang(worker=0, epoch=1), stall_timeout=None, timeout=15)
    assert time.time() - started < 15 + 60  # the deadline and the cancellation, not the hang
    assert left_behind() == []


def test_a_killed_worker_is_retried_and_resumes_from_the_last_epoch(digits_df, digits, tmp_path):
    result = fit(digits_df, epochs=3, callbacks=faults.kill_first_attempt(worker=1, epoch=1),
                 checkpoint_dir=str(tmp_path / "ckpt"), max_retries=1, save_to=str(tmp_path / "models"))
    first, second = result.attempts
    assert first["attempt"] == 1 and first["retryable"] and "killed by signal SIGKILL" in first["error"]
    steps_per_epoch = result.workers[0]["steps_per_epoch"]
    assert {k: v for k, v in second.items() if k != "through_spark"} == {
        "attempt": 2, "error": None, "initial_epoch": 1, "resumed_at": {"epoch": 1, "step": 0, "steps_done": steps_per_epoch}}
    assert len(result.history["loss"]) == 3  # each epoch once: epoch 0 from attempt 1, 1 and 2 from attempt 2
    assert [w["steps"] for w in result.workers] == [2 * steps_per_epoch] * 2  # the resumed run skipped epoch 0
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    # save_to: the resumed attempt keeps the first attempt's saved epoch in its manifest
    assert [s["epoch"] for s in result.saved] == [1, 2, 3]
    manifest = json.loads((tmp_path / "models" / "saved.json").read_text())
    assert [m["logs"]["loss"] for m in manifest] == result.history["loss"]
    assert left_behind() == []


def test_a_killed_worker_without_retries_is_reported_as_retryable(digits_df):
    with pytest.raises(WorkerError, match="killed by signal SIGKILL") as failure:
        fit(digits_df, epochs=2, callbacks=faults.kill_first_attempt(worker=0, epoch=1))
    assert failure.value.worker == 0 and failure.value.retryable
    assert left_behind() == []


def model_function_refusing_its_input():
    """A model function whose checks fail in the training process, where it runs."""
    from tfbarrier.errors import ModelError

    raise ModelError("this model function wants 3 channels")


def test_a_tfbarrier_error_raised_in_a_training_process_keeps_its_class(digits_df):
    from tfbarrier.errors import ModelError

    with pytest.raises(ModelError, match="wants 3 channels") as caught:
        tfbarrier.fit(digits_df, model_function_refusing_its_input, features="pixels", label="digit",
                      num_workers=2, verbose=0)
    assert caught.value.worker in (0, 1) and caught.value.host
    assert "wants 3 channels" in caught.value.log
    assert not isinstance(caught.value, WorkerError)
    assert left_behind() == []


def test_tensorflows_invalid_argument_error_is_a_worker_error_not_tfbarriers(digits_df):
    from tfbarrier.errors import InvalidArgumentError

    labels_out_of_range = digits_df.withColumn("digit", digits_df.digit + 100)
    with pytest.raises(WorkerError, match="Received a label value of 1") as caught:
        fit(labels_out_of_range, epochs=1, verbose=0)
    assert caught.value.exc_type == "InvalidArgumentError"
    assert not isinstance(caught.value, InvalidArgumentError)


def test_one_timeout_covers_every_attempt(digits_df):
    # Every attempt is killed and max_retries would allow 20 more: only the deadline can end the fit.
    started = time.time()
    with pytest.raises(JobTimeoutError, match="ran past its timeout of 20 s") as caught:
        fit(digits_df, epochs=2, callbacks=faults.kill_always(worker=1, epoch=0), max_retries=20, timeout=20,
            verbose=0)
    assert time.time() - started < 20 + 60  # not 21 attempts' worth
    attempts = caught.value.attempts
    assert len(attempts) >= 2 and all("killed by signal SIGKILL" in a["error"] for a in attempts[:-1])
    assert attempts[-1]["error"].startswith("JobTimeoutError") and not attempts[-1]["retryable"]
    assert left_behind() == []


def test_a_port_taken_before_tensorflow_binds_it_is_retried_and_the_fit_succeeds(digits_df, monkeypatch):
    # Worker 0's port is held by this process when TensorFlow binds it (its TF_CONFIG names our port in
    # the first attempt's rendezvous): a real clash, through the exit code, PortClashError and its retry.
    # Under MultiWorkerMirroredStrategy (implementation "ring"): over tfbarrier's ring a process keeps the
    # port it reported listening, so none can be taken.
    from tfbarrier.spark import rendezvous

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    answer = rendezvous.DriverRendezvous.answer

    def answer_with_a_taken_port(self, message, reply):
        def reply_first_attempt_taken(response):
            if message.get("attempt") == 1 and "peers" in response:
                peers = [dict(p, port=held.getsockname()[1]) if i == 0 else p for i, p in enumerate(response["peers"])]
                response = dict(response, peers=peers)
            reply(response)

        answer(self, message, reply_first_attempt_taken)

    monkeypatch.setattr(rendezvous.DriverRendezvous, "answer", answer_with_a_taken_port)
    try:
        result = fit(digits_df, epochs=1, verbose=0, exchange="strategy", communication={"implementation": "ring"})
    finally:
        held.close()
    first, second = result.attempts
    assert first["retryable"] and first["error"].startswith("PortClashError")
    assert second["error"] is None and len(result.history["loss"]) == 1
    assert left_behind() == []
