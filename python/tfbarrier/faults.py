"""Failure rules, all in one place: what a failure is (from an exception, an exit code, or Spark's and
TensorFlow's texts), whom it blames, whether running the job again can help, and what the driver does
next. Standard library only, so that the driver, the task and the training process share it.

The mechanisms stay with their modules: stage.py submits, cancels and waits for tasks; launcher.py keeps
the watchdog's clocks; rendezvous.py probes a silent peer. Each hands what it saw to a function here and
acts on the answer. A new rule is one row in a table below, and one row in tests/python/test_faults.py.
"""

import contextlib
import dataclasses
import enum
import errno
import re
import signal

from tfbarrier import errors
from tfbarrier.errors import (ClusterError, DriverUnreachableError, PortClashError, TfBarrierError, WorkerError,
                              WorkerLostError)
from tfbarrier.settings import PORT_CLASH_ATTEMPTS

# ---- the training process's exit codes ----------------------------------------------------------------
EXIT_OK = 0
EXIT_FAILED = 1  # an exception, described in the work directory's error file
EXIT_PORT_CLASH = 75  # EX_TEMPFAIL: TensorFlow's port was taken in between

# ---- signs in texts -----------------------------------------------------------------------------------
# TensorFlow's server could not bind the port the task reserved for it: another process took it.
PORT_CLASH_SIGNS = ("Could not start gRPC server", "Address already in use")

# TensorFlow's errors for an op that lost contact with a peer (a collective, or the coordination
# service's heartbeat): what the workers that remain see when another worker or its host is lost. A
# model or its data never raises these.
LOST_CONTACT_TYPES = ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError",
                      "PeerLostError")  # the last: an exchange of tfbarrier's own (errors.PeerLostError)

# Spark's failure text for a job whose executor went away.
LOST_EXECUTOR_SIGNS = ("ExecutorLostFailure", "Executor lost", "executor lost")
PYTHON_WORKER_CRASHED = "Python worker exited unexpectedly (crashed)"  # Spark's word for a task's process that died
# Spark's failure text when the driver's JVM could not hold what went through it.
DRIVER_MEMORY_SIGNS = ("TaskResultLost", "OutOfMemoryError", "Java heap space", "spark.driver.maxResultSize")
MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")
_LOST_TASK = re.compile(r"barrier task ResultTask\(\d+, (\d+)\)|Lost task (\d+)\.\d+ in stage")
_LOST_TASK_HOST = re.compile(r"Lost task \S+ in stage \S+ \(TID \d+\) \(([^\s()]+) executor [^)]*\): ExecutorLostFailure")

# OSErrors of a file fetch that mean this machine, not the link, failed: running again elsewhere is no cure.
LOCAL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


# ---- in the training process --------------------------------------------------------------------------

@contextlib.contextmanager
def port_clash_is_retryable():
    """Where TensorFlow binds its port: a taken port becomes a PortClashError, which the driver retries."""
    try:
        yield
    except Exception as exc:
        if any(sign in str(exc) for sign in PORT_CLASH_SIGNS):
            raise PortClashError(str(exc)) from exc
        raise


def exit_code(exc):
    """The exit code of a training process that failed with ``exc``."""
    return EXIT_PORT_CLASH if isinstance(exc, PortClashError) else EXIT_FAILED


# ---- in the task ---------------------------------------------------------------------------------------

def oom_kills():
    """How many processes the kernel's OOM killer has ended on this host since it booted (/proc/vmstat),
    or None where it does not say."""
    try:
        with open("/proc/vmstat") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("oom_kill ")), None)
    except OSError:
        return None


def process_failure(code, info, worker, host, log, oom_kills=None):
    """The error of training process ``worker`` on ``host`` that exited with ``code``; ``info`` is what it
    wrote of its exception ({type, module, message}, empty if nothing) and ``log`` its last lines;
    ``oom_kills`` how many processes the kernel's OOM killer ended on the host while it ran. A tfbarrier
    error of the model or the data keeps its class and is never retried; a process killed by a signal
    (the OOM killer, kill -9) is retryable; any other exception is not."""
    raised = getattr(errors, info.get("type", ""), None) if info.get("module") == errors.__name__ else None
    if isinstance(raised, type) and issubclass(raised, TfBarrierError) and not issubclass(raised, WorkerError):
        return errors.from_worker(raised, f"worker {worker} on {host}: {info['message']}", worker, host, log)
    if info:
        what = f"{info['type']}: {info['message']}"
    elif code == -signal.SIGKILL and oom_kills:
        what = (f"killed by signal SIGKILL while the host ran out of memory (the kernel's OOM killer ended "
                f"{oom_kills} process(es) meanwhile). To fit: give each worker more memory, or train a smaller "
                "model or batch, or fewer workers per host (docs/guides/large-models.md: what a worker needs)")
    elif code < 0:
        what = f"killed by signal {signal.Signals(-code).name}"
    else:
        what = f"exited with status {code}"
    fields = dict(worker=worker, host=host, exc_type=info.get("type"), log=log)
    if code == EXIT_PORT_CLASH:
        return PortClashError(f"worker {worker} on {host} failed: {what}", **fields)
    return WorkerError(f"worker {worker} on {host} failed: {what}", retryable=code < 0, **fields)


def lost_contact(error):
    """True for a WorkerError of a training process whose TensorFlow op failed for want of a peer: a
    consequence of another worker's failure, not a cause."""
    return isinstance(error, WorkerError) and not isinstance(error, WorkerLostError) \
        and error.exc_type in LOST_CONTACT_TYPES


def blame_lost_peer(error, peers, index, host, silent_peers, probe_timeout):
    """The training process's ``error``; or, when it lost contact with a peer whose host no longer answers
    at all (``silent_peers()``: their indexes, asked only then: it probes the network), a WorkerLostError
    naming that peer and its host, with ``error`` as what worker ``index`` on ``host`` saw."""
    if not lost_contact(error):
        return error
    silent = silent_peers()
    if not silent:  # every peer's host answers: a peer's own failure, which its task reports
        return error
    lost = peers[silent[0]]
    others = "".join(f"; worker {i} on {peers[i]['host']} did not answer either" for i in silent[1:])
    why = (f"its host stopped answering during the job (worker {index} on {host} had no answer from "
           f"{lost['host']}:{lost['port']} within {probe_timeout:.0f} s: a cut link, or a machine "
           f"that went down){others}")
    return WorkerLostError.of(silent[0], lost["host"], why, consequence=error)


def fetch_failure(exc, worker, host, what="the model"):
    """The error of a task that could not fetch the job's files (``exc``, an OSError): a full or read-only
    local disk is this machine's failure; anything else is the link's, and the driver sends the files
    through Spark instead (DriverUnreachableError)."""
    reason = f"{type(exc).__name__}: {exc}"
    if getattr(exc, "errno", None) in LOCAL_DISK_ERRNOS:
        return WorkerError(f"worker {worker} on {host} could not write {what} to its local disk ({reason}): "
                           "free space in the executor's temporary directory (spark.local.dir, TMPDIR)",
                           worker=worker, host=host, exc_type=type(exc).__name__)
    return DriverUnreachableError(f"worker {worker} on {host} could not fetch {what} from the driver's link "
                                  f"({reason})", worker=worker, host=host)


# ---- on the driver: a failed Spark job -----------------------------------------------------------------

@dataclasses.dataclass
class JobFailure:
    """What the driver knows of a failed barrier job: Spark's ``text``, whether its SparkContext still
    runs (``driver_alive()``: asked only when a rule needs it), where each worker ran (``hosts``) and the
    hosts whose executors are gone (``lost_hosts``)."""

    text: str
    driver_alive: object = lambda: True
    hosts: dict = dataclasses.field(default_factory=dict)
    lost_hosts: frozenset = frozenset()

    @property
    def first_line(self):
        return self.text.strip().splitlines()[0] if self.text.strip() else ""


def missing_module(text, python=None):
    """The ClusterError for a Python worker whose failure ``text`` says it lacks a module (``python``: the
    executors' interpreter, when known), else None."""
    import sys

    missing = MISSING_MODULE.search(text)
    if missing is None:
        return None
    which = f"run {python}, which has" if python else "run a Python that has"
    return ClusterError(
        f"Spark's Python workers {which} no module {missing.group(1)!r}, so no task can start. Run them in a "
        f"Python that has tfbarrier (this one: set PYSPARK_PYTHON={sys.executable} in the environment before the "
        "SparkSession starts, or spark.pyspark.python), or run your script from the activated virtualenv")


def _driver_stopped(failure):
    if failure.driver_alive():
        return None
    return ClusterError(
        f"Spark's driver stopped during the job ({failure.first_line or 'no message: its JVM is gone'}): the "
        "SparkContext is shut down, so start a new SparkSession. If its JVM ran out of memory, give it more "
        "(spark.driver.memory)")


def _driver_memory(failure):
    if not any(sign in failure.text for sign in DRIVER_MEMORY_SIGNS):
        return None
    return ClusterError(
        f"Spark's driver could not hold what the job sent through it ({failure.first_line}): the tasks' results, "
        "or the job's files (the model's weights) where the executors cannot reach the driver's link, pass "
        "through the driver's JVM. Give it more memory (spark.driver.memory, spark.driver.maxResultSize), "
        "or let the executors reach the driver (spark.tfbarrier.driverLink)")


def _failed_task(text):
    """The partition (the worker) of the barrier task Spark's failure ``text`` names, or None."""
    task = _LOST_TASK.search(text)
    return int(task.group(1) or task.group(2)) if task else None


def _lost_executor(failure):
    """The WorkerLostError of a job Spark failed because it lost an executor: the worker is the barrier
    task's partition, its host Spark's word, the rendezvous' or the one host whose executors are gone."""
    text = failure.text
    if not any(sign in text for sign in LOST_EXECUTOR_SIGNS):
        return None
    worker = _failed_task(text)
    host = _LOST_TASK_HOST.search(text)
    lost_hosts = failure.lost_hosts
    host = host.group(1) if host else failure.hosts.get(worker) or (next(iter(lost_hosts)) if len(lost_hosts) == 1 else None)
    reason = next((line.strip() for line in text.splitlines() if "ExecutorLostFailure" in line), "")
    reason = reason[reason.index("ExecutorLostFailure"):] if reason else "an executor was lost"
    return WorkerLostError.of(worker, host, f"Spark lost its executor ({reason})")


def _crashed_python_worker(failure):
    """The WorkerLostError of a job whose barrier task's Python worker died under it (Spark: "Python worker exited
    unexpectedly (crashed)"): killed, or its host going down, whose executor may report the task before it dies
    itself (then Spark has not lost that executor yet). The worker is the task's partition, its host the
    rendezvous' word."""
    if PYTHON_WORKER_CRASHED not in failure.text:
        return None
    worker = _failed_task(failure.text)
    host = failure.hosts.get(worker)
    gone = " (its host's executor is gone too)" if host and host in failure.lost_hosts else ""
    return WorkerLostError.of(worker, host, f"its Spark Python worker exited unexpectedly (crashed): its process was "
                                            f"killed, or its host went down{gone}")


# In order: the first rule that names an error wins.
JOB_FAILURE_RULES = (
    ("a task's tfbarrier error, carried in Spark's text", lambda failure: errors.decode(failure.text)),
    ("Python workers without tfbarrier's packages", lambda failure: missing_module(failure.text)),
    ("the driver's SparkContext stopped", _driver_stopped),
    ("the driver's JVM could not hold the results or files", _driver_memory),
    ("Spark lost an executor", _lost_executor),
    ("a task's Python worker crashed", _crashed_python_worker),
)


def job_failure(failure):
    """The tfbarrier error a failed job (a JobFailure) means, or None when no rule knows it (the driver
    raises Spark's own exception)."""
    for _, rule in JOB_FAILURE_RULES:
        error = rule(failure)
        if error is not None:
            return error
    return None


def blame_lost_executor(error, gone_hosts, hosts):
    """``error``; or, when it is a worker's aborted collective (lost_contact) while Spark gave up the
    executors of ``gone_hosts``, the WorkerLostError of the job's first worker on one of them (``hosts``:
    {worker: host}, empty when the rendezvous did not finish), with ``error`` as its context."""
    if not lost_contact(error):
        return error
    gone = set(gone_hosts) & set(hosts.values()) if hosts else set(gone_hosts)
    if not gone:
        return error
    host = sorted(gone)[0]
    worker = min((w for w, h in hosts.items() if h == host), default=None)
    return WorkerLostError.of(worker, host, "Spark lost its executor during the job", consequence=error)


# ---- on the driver: what to do next ---------------------------------------------------------------------

class Next(enum.Enum):
    """What the driver does after a failed attempt."""

    RESEND_THROUGH_SPARK = "run again with the job's files inside it (not counted against max_retries)"
    RETRY_IN_PLACE = "run again at once (not counted against max_retries)"
    RETRY = "run again (one of max_retries)"
    RETRY_WHEN_SLOTS = "run again once the cluster has room for every worker (one of max_retries)"
    RAISE = "give up: raise the error"


@dataclasses.dataclass
class RetryPolicy:
    """The driver's retry rule, counting as it goes: ``max_retries`` retryable failures, plus up to
    PORT_CLASH_ATTEMPTS - 1 port clashes and one resend through Spark when the driver's link is out of
    the tasks' reach. A timeout is never retried."""

    max_retries: int = 0
    failures: int = 0
    clashes: int = 0

    def next(self, error, files_inline):
        """What to do after ``error``; ``files_inline``: the job's files already travel through Spark."""
        if isinstance(error, DriverUnreachableError) and not files_inline:
            return Next.RESEND_THROUGH_SPARK
        if isinstance(error, PortClashError):
            self.clashes += 1
            return Next.RETRY_IN_PLACE if self.clashes < PORT_CLASH_ATTEMPTS else Next.RAISE
        if not isinstance(error, WorkerError) or not error.retryable or self.failures >= self.max_retries:
            return Next.RAISE
        self.failures += 1
        return Next.RETRY_WHEN_SLOTS if isinstance(error, WorkerLostError) else Next.RETRY
