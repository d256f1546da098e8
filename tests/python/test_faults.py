"""faults.py's rules, one row each: what a failure is, whom it blames, and what the driver does next.
A new rule gets a row here."""

import errno
import signal

import pytest

from tfbarrier import errors, faults
from tfbarrier.errors import (ClusterError, ColumnError, DriverUnreachableError, JobTimeoutError, ModelError,
                              PortClashError, WorkerError, WorkerLostError)


def worker_error(exc_type, cls=WorkerError, retryable=False):
    return cls("worker 0 on host-a failed", worker=0, host="host-a", exc_type=exc_type, retryable=retryable)


# ---- the training process's exit -------------------------------------------------------------------------

@pytest.mark.parametrize("code, info, cls, retryable, says", [
    (1, {"type": "ValueError", "module": "builtins", "message": "bad shape"}, WorkerError, False, "ValueError: bad shape"),
    (1, {"type": "ColumnError", "module": "tfbarrier.errors", "message": "no column x"}, ColumnError, None, "no column x"),
    (1, {"type": "ModelError", "module": "elsewhere", "message": "m"}, WorkerError, False, "ModelError: m"),
    (faults.EXIT_PORT_CLASH, {"type": "PortClashError", "module": "tfbarrier.errors", "message": "taken"},
     PortClashError, True, "taken"),
    (-signal.SIGKILL, {}, WorkerError, True, "killed by signal SIGKILL"),
    (3, {}, WorkerError, False, "exited with status 3"),
])
def test_a_training_process_exit_becomes_its_error(code, info, cls, retryable, says):
    error = faults.process_failure(code, info, 1, "host-b", "last line", oom_kills=0)
    assert type(error) is cls
    assert (error.worker, error.host, error.log) == (1, "host-b", "last line")
    assert says in str(error) and str(error).startswith("worker 1 on host-b")
    assert getattr(error, "retryable", None) is retryable


def test_a_training_process_killed_while_the_host_ran_out_of_memory_says_so_and_what_to_change():
    """The kernel's OOM killer ends a process with SIGKILL: on its own, "killed by signal SIGKILL" (what
    two workers of a 400 M model that the memory check had passed printed) does not say why."""
    error = faults.process_failure(-signal.SIGKILL, {}, 1, "host-b", "", oom_kills=1)
    assert type(error) is WorkerError and error.retryable
    assert "killed by signal SIGKILL while the host ran out of memory (the kernel's OOM killer ended 1 process(es)" \
        in str(error) and "a smaller model or batch" in str(error)
    assert "ran out of memory" not in str(faults.process_failure(-signal.SIGTERM, {}, 1, "host-b", "", oom_kills=1))


@pytest.mark.parametrize("exc, code", [(PortClashError("taken"), faults.EXIT_PORT_CLASH),
                                       (ValueError("x"), faults.EXIT_FAILED),
                                       (KeyboardInterrupt(), faults.EXIT_FAILED)])
def test_an_exception_in_the_training_process_sets_its_exit_code(exc, code):
    assert faults.exit_code(exc) == code


@pytest.mark.parametrize("text, clash", [
    ("UnknownError: Could not start gRPC server", True),
    ("OSError: [Errno 98] Address already in use", True),
    ("ValueError: Shapes (None, 1) and (None, 10) are incompatible", False),
])
def test_tensorflows_server_failing_to_bind_is_a_port_clash(text, clash):
    with pytest.raises(PortClashError if clash else RuntimeError):
        with faults.port_clash_is_retryable():
            raise RuntimeError(text)


# ---- a lost peer ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("error, lost", [
    (worker_error("UnavailableError"), True),
    (worker_error("DeadlineExceededError"), True),
    (worker_error("AbortedError"), True),
    (worker_error("CancelledError"), True),
    (worker_error("PeerLostError"), True),  # tfbarrier's ring lost a peer (errors.PeerLostError)
    # errors of the model or its data are causes, never consequences of a lost peer
    (worker_error("ValueError"), False),
    (worker_error("InvalidArgumentError"), False),
    (worker_error("ResourceExhaustedError"), False),
    (worker_error(None), False),
    (WorkerLostError.of(1, "host-b", "gone"), False),  # already the cause
    (ModelError("not compiled"), False),
])
def test_only_errors_of_a_lost_peer_count_as_lost_contact(error, lost):
    assert faults.lost_contact(error) is lost


PEERS = [{"host": "host-a", "port": 1}, {"host": "host-b", "port": 2}, {"host": "host-c", "port": 3}]


@pytest.mark.parametrize("error, silent, blamed", [
    (worker_error("UnavailableError"), [1], (1, "host-b")),
    (worker_error("UnavailableError"), [2, 1], (2, "host-c")),
    (worker_error("UnavailableError"), [], None),  # every host answers: the peer's own task reports its failure
    (worker_error("ValueError"), [1], None),  # a cause of its own: the network is not asked
])
def test_a_worker_that_lost_contact_blames_the_peer_whose_host_went_silent(error, silent, blamed):
    asked = []
    result = faults.blame_lost_peer(error, PEERS, 0, "host-a", lambda: asked.append(1) or silent, 10)
    if blamed is None:
        assert result is error
    else:
        assert type(result) is WorkerLostError and (result.worker, result.host) == blamed
        assert "had no answer from" in str(result) and str(error) in str(result)
    assert bool(asked) is faults.lost_contact(error)


@pytest.mark.parametrize("error, gone, hosts, blamed", [
    (worker_error("AbortedError"), {"host-b"}, {0: "host-a", 1: "host-b"}, (1, "host-b")),
    (worker_error("AbortedError"), {"host-z"}, {0: "host-a", 1: "host-b"}, None),  # not one of the job's hosts
    (worker_error("AbortedError"), {"host-z"}, {}, (None, "host-z")),  # no rendezvous: any lost host
    (worker_error("AbortedError"), set(), {0: "host-a"}, None),
    (worker_error("ValueError"), {"host-b"}, {0: "host-a", 1: "host-b"}, None),
])
def test_an_aborted_collective_blames_the_worker_on_a_host_spark_lost(error, gone, hosts, blamed):
    result = faults.blame_lost_executor(error, gone, hosts)
    if blamed is None:
        assert result is error
    else:
        assert type(result) is WorkerLostError and (result.worker, result.host) == blamed


# ---- fetching the job's files ----------------------------------------------------------------------------

@pytest.mark.parametrize("exc, cls, retryable, says", [
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), DriverUnreachableError, True, "driver's link"),
    (TimeoutError("timed out"), DriverUnreachableError, True, "driver's link"),
    (ConnectionError("the connection closed 10 of 20 bytes"), DriverUnreachableError, True, "driver's link"),
    (OSError(errno.ENOSPC, "No space left on device"), WorkerError, False, "local disk"),
    (OSError(errno.EROFS, "Read-only file system"), WorkerError, False, "local disk"),
])
def test_a_failed_fetch_blames_the_link_unless_the_local_disk_failed(exc, cls, retryable, says):
    error = faults.fetch_failure(exc, 2, "host-c")
    assert type(error) is cls and error.retryable is retryable
    assert says in str(error) and (error.worker, error.host) == (2, "host-c")


# ---- a failed Spark job ----------------------------------------------------------------------------------

LOST_EXECUTOR = ("Job aborted due to stage failure: Could not recover from a failed barrier ResultStage. Most "
                 "recent failure reason: Stage failed because barrier task ResultTask(3, 1) finished unsuccessfully.\n"
                 "ExecutorLostFailure (executor 1 exited caused by one of the running tasks) Reason: Remote RPC "
                 "client disassociated.")
# a host killed: its executor reported the task's Python worker dead before it died itself (test_host_faults saw it)
CRASHED_PYTHON_WORKER = ("Job aborted due to stage failure: Could not recover from a failed barrier ResultStage. Most "
                         "recent failure reason: Stage failed because barrier task ResultTask(38, 1) finished "
                         "unsuccessfully.\norg.apache.spark.SparkException: Python worker exited unexpectedly "
                         "(crashed). Consider setting 'spark.python.worker.faulthandler.enabled' to 'true'")
LOST_TASK_WITH_HOST = ("Lost task 0.0 in stage 2.0 (TID 7) (10.1.0.2 executor 3): ExecutorLostFailure "
                       "(executor 3 exited) Reason: Command exited with code 137")


@pytest.mark.parametrize("failure, cls, fields, says", [
    (faults.JobFailure("RuntimeError: " + errors.encode(ColumnError("label column 'y' has nulls"))),
     ColumnError, {}, "label column 'y' has nulls"),
    (faults.JobFailure("PythonException: ModuleNotFoundError: No module named 'tfbarrier'"),
     ClusterError, {}, "no module 'tfbarrier'"),
    (faults.JobFailure("Py4JError: An error occurred", driver_alive=lambda: False),
     ClusterError, {}, "Spark's driver stopped during the job"),
    (faults.JobFailure("java.lang.OutOfMemoryError: Java heap space"), ClusterError, {}, "spark.driver.maxResultSize"),
    (faults.JobFailure("TaskResultLost (result lost from block manager)"), ClusterError, {}, "could not hold"),
    (faults.JobFailure(LOST_EXECUTOR, hosts={0: "h0", 1: "h1"}), WorkerLostError,
     {"worker": 1, "host": "h1"}, "Spark lost its executor (ExecutorLostFailure (executor 1 exited"),
    (faults.JobFailure(LOST_TASK_WITH_HOST, hosts={0: "h0"}), WorkerLostError, {"worker": 0, "host": "10.1.0.2"},
     "Command exited with code 137"),
    (faults.JobFailure("Executor lost", lost_hosts=frozenset({"h2"})), WorkerLostError,
     {"worker": None, "host": "h2"}, "an executor was lost"),
    (faults.JobFailure(CRASHED_PYTHON_WORKER, hosts={0: "h0", 1: "h1"}), WorkerLostError, {"worker": 1, "host": "h1"},
     "its Spark Python worker exited unexpectedly (crashed): its process was killed, or its host went down"),
])
def test_a_failed_jobs_text_becomes_its_error(failure, cls, fields, says):
    error = faults.job_failure(failure)
    assert type(error) is cls and says in str(error)
    assert {name: getattr(error, name) for name in fields} == fields


def test_a_failure_no_rule_knows_is_left_to_spark_and_the_driver_is_asked_only_when_needed():
    asked = []
    assert faults.job_failure(faults.JobFailure("IllegalArgumentException: x", lambda: asked.append(1) or True)) is None
    assert asked == [1]
    faults.job_failure(faults.JobFailure("RuntimeError: " + errors.encode(ModelError("m")), lambda: asked.append(2)))
    assert asked == [1]  # a task's own error needs no JVM call


# ---- what the driver does next ---------------------------------------------------------------------------

LINK = DriverUnreachableError("could not fetch", worker=0, host="h")
CLASH = PortClashError("taken", worker=0, host="h")
KILLED = worker_error(None, retryable=True)
LOST = WorkerLostError.of(1, "h1", "gone")
BUG = worker_error("ValueError")


@pytest.mark.parametrize("max_retries, errors_in_turn, files_inline, steps", [
    (0, [LINK], False, ["RESEND_THROUGH_SPARK"]),
    (0, [LINK], True, ["RAISE"]),  # the files already came through Spark: a retryable failure like any other
    (1, [LINK], True, ["RETRY"]),
    (0, [CLASH, CLASH, CLASH], False, ["RETRY_IN_PLACE", "RETRY_IN_PLACE", "RAISE"]),
    (0, [KILLED], False, ["RAISE"]),
    (2, [KILLED, KILLED, KILLED], False, ["RETRY", "RETRY", "RAISE"]),
    (1, [CLASH, KILLED, CLASH], False, ["RETRY_IN_PLACE", "RETRY", "RETRY_IN_PLACE"]),  # clashes spend no retry
    (1, [LOST, LOST], False, ["RETRY_WHEN_SLOTS", "RAISE"]),
    (5, [BUG], False, ["RAISE"]),  # an error of the model or the data is never retried
    (5, [ColumnError("no column")], False, ["RAISE"]),
    (5, [JobTimeoutError("past its timeout")], False, ["RAISE"]),  # one deadline for every attempt
    (5, [ClusterError("no slots")], False, ["RAISE"]),
])
def test_the_retry_policy_decides_what_the_driver_does_next(max_retries, errors_in_turn, files_inline, steps):
    policy = faults.RetryPolicy(max_retries)
    assert [policy.next(error, files_inline).name for error in errors_in_turn] == steps
