"""Exception types of tfbarrier: one class per kind of failure.

Every message says what went wrong and what to change. The R package maps each class to an R
condition of the same name.
"""


class TfBarrierError(Exception):
    """Base class of every error tfbarrier raises. An error raised in a training process keeps its
    class on the driver, with ``worker`` (its index), ``host`` and ``log`` (the last lines of its
    output) set; they are None and "" for errors raised on the driver."""

    worker = host = None
    log = ""


class InvalidArgumentError(TfBarrierError, ValueError):
    """An argument of fit()/run() has a wrong type or value."""


class ColumnError(TfBarrierError, ValueError):
    """A feature or label column is missing or has a type tfbarrier cannot train on."""


class ModelError(TfBarrierError, ValueError):
    """The model cannot be shipped to the workers (not compiled, not serialisable, unsupported shape)."""


class ClusterError(TfBarrierError, RuntimeError):
    """The Spark cluster cannot run the barrier stage (too few free task slots, dynamic allocation)."""


class JobTimeoutError(TfBarrierError, TimeoutError):
    """fit(), run() or apply() ran past its ``timeout``, which covers every attempt; the Spark job was
    cancelled and every worker stopped. ``attempts`` lists the attempts, the cancelled one last. Also
    known by its former name, ``FitTimeoutError`` (in R too)."""

    former_names = ("FitTimeoutError",)


FitTimeoutError = JobTimeoutError  # the name before run() and apply() had timeouts too


class ReplicasDivergedError(TfBarrierError, RuntimeError):
    """The workers of a fit ended with different weights (their checksums differ), so no one model is the
    trained one: a weight updated outside ``model.optimizer``, a callback that changed one worker's weights,
    or ops that differ from worker to worker. ``checksums`` holds each worker's."""

    def __init__(self, message, checksums=None):
        super().__init__(message)
        self.checksums = checksums


class TrialsFailedError(TfBarrierError, RuntimeError):
    """Every trial of tune() failed (or none reported the metric); ``trials`` is the table of them,
    each with its error."""

    def __init__(self, message, trials=None):
        super().__init__(message)
        self.trials = trials


class WorkerError(TfBarrierError, RuntimeError):
    """A training worker failed. ``worker`` is the failing worker's index, ``host`` its host,
    ``exc_type`` the original exception's type, ``log`` the last lines of its output. ``retryable``
    says whether running the job again can help (a killed process, a lost executor, a port clash),
    as opposed to an error in the model or the data."""

    def __init__(self, message, worker=None, host=None, exc_type=None, log="", retryable=False):
        super().__init__(message)
        self.worker = worker
        self.host = host
        self.exc_type = exc_type
        self.log = log
        self.retryable = retryable


class PeerLostError(WorkerError):
    """A training process's exchange lost a peer (it went silent, closed its connection, or stopped reading):
    a consequence of that peer's failure, which the driver traces to its cause (faults.LOST_CONTACT_TYPES),
    as it does TensorFlow's own errors of a lost peer. Retryable."""

    def __init__(self, message, **fields):
        fields["retryable"] = True
        super().__init__(message, **fields)


class WorkerStalledError(WorkerError):
    """A worker made no progress for ``stall_timeout`` seconds (a stuck collective, a deadlock)."""


class WorkerLostError(WorkerError):
    """A worker was lost during the job with its host or executor: its host stopped answering its peers
    (a cut link, a machine that went down) or Spark lost its executor. ``host`` is that host and
    ``worker`` the lost worker (None when Spark did not say which); the message ends with what the
    workers that remained saw (their collective aborted) as context. Always retryable: with
    ``max_retries`` the job runs again on the executors the cluster has by then, and resumes from
    ``checkpoint_dir``."""

    def __init__(self, message, **fields):
        fields["retryable"] = True
        super().__init__(message, **fields)

    @classmethod
    def of(cls, worker, host, why, consequence=None):
        """Worker ``worker`` on ``host`` (either None: unknown) was lost, ``why`` says how; ``consequence`` is
        the error of a worker that remained (its aborted collective), kept as context."""
        who = (f"worker {worker}" if worker is not None else "a worker") + (f" on {host}" if host else "")
        message = f"{who} was lost: {why}. Running the job again can help (max_retries, with checkpoint_dir to resume)"
        if consequence is not None:
            message += f"\n--- what the workers that remained saw, as a consequence ---\n{consequence}"
        return cls(message, worker=worker, host=host)


class EnvironmentBuildError(WorkerError):
    """An executor could not build (or find) the Python environment of the training process;
    the message names the host, the requirements and the last lines of pip's output."""


class PortClashError(WorkerError):
    """Another process took a worker's port between choosing it and TensorFlow binding it.
    fit()/run() retry these on their own."""

    def __init__(self, message, **fields):
        fields["retryable"] = True
        super().__init__(message, **fields)


class DriverUnreachableError(WorkerError):
    """A task could not fetch the job's files through the driver's link (a firewall between executors
    and driver?): the driver submits the job again with the files inside it, through Spark."""

    def __init__(self, message, **fields):
        fields["retryable"] = True
        super().__init__(message, **fields)


def class_names(error):
    """The tfbarrier classes of ``error``, most specific first (former names after the current one);
    empty for other exceptions. R's conditions carry these names in their class vector."""
    return [name for cls in type(error).__mro__ if issubclass(cls, TfBarrierError)
            for name in (cls.__name__, *cls.__dict__.get("former_names", ()))]


# ---- carrying an error from a barrier task to the driver ----------------------------------------
# Spark hands the driver only the text of a failed task's exception. The task puts the error's class
# and fields into that text, base64-encoded on one line, and the driver raises the same class again.
_MARK = "tfbarrier-error:"
_FIELDS = ("worker", "host", "exc_type", "log", "retryable")


def encode(error):
    """A one-line string that carries ``error`` (a TfBarrierError) through Spark's failure text."""
    import base64
    import json

    payload = {"class": type(error).__name__, "message": str(error)}
    payload.update({f: getattr(error, f) for f in _FIELDS if hasattr(error, f)})
    return _MARK + base64.b64encode(json.dumps(payload).encode()).decode() + ";"


def decode(text):
    """The TfBarrierError encoded in ``text`` (e.g. a Spark job failure), or None."""
    import base64
    import json
    import re

    match = re.search(re.escape(_MARK) + r"([A-Za-z0-9+/=]+);", text)
    if not match:
        return None
    payload = json.loads(base64.b64decode(match.group(1)))
    cls = globals().get(payload.pop("class"))
    if not (isinstance(cls, type) and issubclass(cls, TfBarrierError)):
        cls = WorkerError
    message = payload.pop("message")
    if issubclass(cls, WorkerError):
        error = cls(message, **payload)
    else:
        error = from_worker(cls, message, payload.get("worker"), payload.get("host"), payload.get("log", ""))
    if error.log:
        error.args = (f"{message}\n--- last lines of worker {error.worker}'s output ---\n{error.log}",)
    return error


def from_worker(cls, message, worker, host, log):
    """A ``cls`` error (not a WorkerError) raised in training process ``worker`` on ``host``."""
    error = cls(message)
    error.worker, error.host, error.log = worker, host, log
    return error
