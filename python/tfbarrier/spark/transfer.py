"""What a job carries outside Spark: the files the driver hands every task (the model's weights, the
user's pickled functions) and the files a task hands back (the trained weights, a returned value).

Spark's task closures and results pass through the driver's JVM, which holds each whole in its heap:
a model of a few hundred megabytes there takes the user's SparkContext down with a Java heap error.
So the job itself stays small: each large value in it is a ``Payload``, a file in the driver's
``JobFiles`` directory. A task fetches every payload through the driver link (driver_link.py) into
its work directory while it writes its shard, and its training process reads them from there; the
files a training process reports (``ProcessReport.files``) go back to the driver the same way.
Neither end holds a whole file in memory.

Every payload carries the SHA-256 of its file, and so does every file a task returns (in its result,
through Spark): a fetched payload is put in place only when it is that file (driver_link.fetch), and the
driver checks a returned file before anyone reads it (``JobFiles.received``), so a file changed on the
driver link's wire is refused, never unpickled or loaded.

Where no task can reach the driver's link (the driver cannot listen on ``spark.driver.host``, the
executors cannot connect to it, or ``spark.tfbarrier.driverLink`` is false), the payloads travel
inside the job and the returned files inside the task's result, through Spark, as ``Payload.data``:
the driver's JVM then needs room for the model (``spark.driver.memory``).
"""

import dataclasses
import hashlib
import os
import shutil
import threading
import time

from tfbarrier import atomic, faults
from tfbarrier.errors import ClusterError
from tfbarrier.spark import workdirs


@dataclasses.dataclass(frozen=True)
class Payload:
    """A file a job carries: its ``name`` in the driver's JobFiles and in the task's work directory, its
    ``size`` in bytes, and ``data``, its bytes, only when it travels through Spark."""

    name: str
    size: int
    data: bytes = dataclasses.field(default=None, repr=False)
    sha256: str = None  # of the file's bytes (hex)

    def path(self, workdir):
        """Where the file is in a task's work directory."""
        return os.path.join(workdir, self.name)


class JobFiles:
    """The driver's directory for one job (a fit, a run, an apply): the payloads it serves to the
    tasks, and the files they send back (``received/``). Removed by ``close``."""

    def __init__(self):
        workdirs.sweep()  # what killed drivers left on this host
        self.directory = workdirs.make("tfbarrier-job-")
        self._received = os.path.join(self.directory, "received")
        os.mkdir(self._received, 0o700)
        self._served = {}
        self._took = {}  # name -> SHA-256 of the file a task put there

    def add(self, name, write):
        """A Payload of the file that ``write(path)`` writes."""
        path = os.path.join(self.directory, name)
        write(path)
        self._served[name] = path
        return Payload(name, os.path.getsize(path), sha256=sha256_of(path))

    def add_bytes(self, name, data):
        def write(path):
            with atomic.private_file(path) as f:
                f.write(data)

        return self.add(name, write)

    def inline(self, payload):
        """``payload`` with its bytes in it, to travel through Spark."""
        if payload.data is not None:
            return payload
        with open(self._served[payload.name], "rb") as f:
            return dataclasses.replace(payload, data=f.read())

    def served(self, name):
        """The path of payload ``name`` (the driver link serves it), None if there is no such payload."""
        return self._served.get(name)

    def receiving(self, name):
        """Where a task's file ``name`` goes (the driver link writes it there)."""
        if not isinstance(name, str) or os.path.basename(name) != name or name.startswith("."):
            return None
        return os.path.join(self._received, name)

    def took(self, name, sha256):
        """The driver link wrote a task's file ``name``, whose bytes hash to ``sha256``."""
        self._took[name] = sha256

    def received(self, payload):
        """The path on the driver of a file a task returned (written out when it came through Spark), once it
        is the file the task's result names. ClusterError when it is not: changed on the way."""
        path = os.path.join(self._received, payload.name)
        if payload.data is not None:
            with atomic.private_file(path) as f:
                f.write(payload.data)
        elif payload.sha256 is None or self._took.get(payload.name) != payload.sha256:
            raise ClusterError(
                f"the file {payload.name!r} that a task sent over the driver's link is not the one its result names "
                f"(SHA-256 {str(self._took.get(payload.name))[:16]}... against {str(payload.sha256)[:16]}...): it "
                "was changed on the way, and nothing read it. On a network others can reach, encrypt the job's traffic "
                "(spark.tfbarrier.encrypt=always, or Spark's own encryption)")
        return path

    def close(self):
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def sha256_of(path):
    """The SHA-256 of the file at ``path`` (hex), read a chunk at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def payloads_of(value):
    """Every Payload inside ``value`` (a job: dataclasses, dicts, lists, nested)."""
    if isinstance(value, Payload):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [p for field in dataclasses.fields(value) for p in payloads_of(getattr(value, field.name))]
    if isinstance(value, dict):
        return [p for item in value.values() for p in payloads_of(item)]
    if isinstance(value, (list, tuple)):
        return [p for item in value for p in payloads_of(item)]
    return []


def with_payloads_inline(value, files):
    """``value`` (a job) with each Payload in it carrying its bytes (JobFiles.inline)."""
    if isinstance(value, Payload):
        return files.inline(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {field.name: with_payloads_inline(getattr(value, field.name), files)
                   for field in dataclasses.fields(value) if payloads_of(getattr(value, field.name))}
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, dict):
        return {key: with_payloads_inline(item, files) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(with_payloads_inline(item, files) for item in value)
    return value


def all_inline(value):
    """Whether every payload of ``value`` (a job) carries its bytes."""
    return all(p.data is not None for p in payloads_of(value))


# ---- in the task ------------------------------------------------------------------------------------

class Fetch:
    """The job's payloads on their way into a task's work directory, in a thread of their own (the task
    writes its shard meanwhile). ``wait`` returns what it took: bytes and seconds."""

    def __init__(self, job, link, workdir):
        self._payloads = payloads_of(job)
        self._link, self._workdir = link, workdir
        self._error = None
        self.stats = {"bytes": 0, "seconds": 0.0, "via": "driver link"}
        self._thread = threading.Thread(target=self._run, name="tfbarrier-fetch", daemon=True)
        self._thread.start()

    def _run(self):
        started = time.time()
        try:
            for payload in self._payloads:
                if payload.data is not None:  # it came inside the job, through Spark
                    self.stats["via"] = "spark"
                    with atomic.private_file(payload.path(self._workdir)) as f:
                        f.write(payload.data)
                else:
                    self._link.fetch(payload.name, payload.path(self._workdir), payload.sha256)
                self.stats["bytes"] += payload.size
        except OSError as exc:
            self._error = exc
        self.stats["seconds"] = time.time() - started

    def wait(self, worker, host):
        self._thread.join()
        if self._error is not None:
            raise faults.fetch_failure(self._error, worker, host)
        return self.stats


def send_back(files, link, workdir, worker):
    """The files a training process reported (``{key: file name in workdir}``) as Payloads on the
    driver: streamed through the link as ``<worker>-<name>``, or carried in the result (through Spark)
    where the link cannot take them."""
    sent = {}
    for key, name in (files or {}).items():
        path, returned = os.path.join(workdir, name), f"{worker}-{name}"
        try:
            digest = sha256_of(path)  # before it leaves: what the driver checks it against
            size = link.put(returned, path)
            sent[key] = Payload(returned, size, sha256=digest)
        except OSError:
            with open(path, "rb") as f:
                data = f.read()
            sent[key] = Payload(returned, len(data), data)
    return sent



# ---- files served for as long as the driver runs: predict()'s models ----------------------------------

class SessionFiles(JobFiles):
    """The driver's files that lazy DataFrames may fetch at any time (``predict``'s scoring models):
    one file per distinct content, kept until the driver process exits."""

    def __init__(self):
        super().__init__()
        self._digests, self._adding = {}, threading.Lock()  # name -> SHA-256 of a file written once

    def add_file(self, name, write):
        """A Payload of what ``write(path)`` writes, under ``name``, which names one content (its digest is in
        it): a file served already is not written again (replacing a large file costs as much as hashing it)."""
        path = os.path.join(self.directory, name)
        with self._adding:
            if name not in self._digests:
                scratch = os.path.join(self.directory, f".writing-{threading.get_ident()}-{name}")
                write(scratch)
                os.replace(scratch, path)
                self._digests[name] = sha256_of(path)
            self._served[name] = path
        return Payload(name, os.path.getsize(path), sha256=self._digests[name])

    def receiving(self, name):
        return None  # nothing comes back to these


_session = {}  # (host, encrypted) -> (SessionFiles, DriverServer) of this driver process
_session_lock = threading.Lock()


def session_server(host, encrypted=False):
    """(SessionFiles, the DriverServer on ``host`` serving them, over TLS when ``encrypted``), started on
    first use and closed when the driver process exits (``close_sessions``). Raises OSError when the driver cannot listen on
    ``host``."""
    import atexit

    from tfbarrier.tls import Credentials
    from tfbarrier.spark.driver_link import DriverServer

    with _session_lock:
        if (host, encrypted) not in _session:
            files = SessionFiles()
            try:
                server = DriverServer(host, files=files, tls=Credentials.new() if encrypted else None)
            except OSError:
                files.close()
                raise
            if not _session:
                atexit.register(close_sessions)
            _session[host, encrypted] = files, server
        return _session[host, encrypted]


def close_sessions():
    """Close this driver process's session servers and remove their files: at Python's exit (atexit), and at
    R's, whose embedded Python runs no atexit handler (R's package calls it, python.R)."""
    with _session_lock:
        for files, server in _session.values():
            server.close()
            files.close()
        _session.clear()
