"""The task's handle on its training process: start it (or take a spare an earlier task on the same
executor left, spares.py), talk to it (protocol.py), and never leave it alive after the task ends
(killed on failure, on cancel, and when its parent dies). What runs inside the process is
training_process.py.
"""

import ctypes
import ctypes.util
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from tfbarrier import atomic, faults, settings
from tfbarrier.errors import WorkerError, WorkerStalledError
from tfbarrier.spark import protocol, workdirs
from tfbarrier.spark.protocol import LOG_FILE


@functools.lru_cache(maxsize=None)
def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)  # find_library runs ldconfig


def _prctl(option, value):
    if sys.platform.startswith("linux"):
        _libc().prctl(option, value)


def die_with_parent():  # in a child between fork and exec, or a forked one (spares.py)
    _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def name_process(name):
    """Set the process's name (``ps -o comm``, /proc/PID/comm; at most 15 bytes)."""
    _prctl(15, ctypes.c_char_p(name.encode()[:15]))  # PR_SET_NAME


def log_tail(workdir, lines=settings.LOG_TAIL_LINES):
    if workdir is None:
        return ""
    try:
        with open(os.path.join(workdir, LOG_FILE), "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def importable_home(prefix, env):
    """A new private directory (workdirs.py) holding only a link to this tfbarrier package, and ``env``
    with it first on PYTHONPATH: a process started there imports tfbarrier from wherever this one did, and
    nothing else from that place."""
    home = workdirs.make(prefix)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tfbarrier/, this module's grandparent
    os.symlink(package, os.path.join(home, "tfbarrier"))
    return home, dict(env, PYTHONPATH=os.pathsep.join(p for p in (home, env.get("PYTHONPATH")) if p))


class TrainingProcess:
    """``python -m tfbarrier.spark.training_process FD`` started in ``env``. It imports TensorFlow at once, then waits
    for the job ``adopt`` sends it, so it can be started ahead of its task (a spare, see spares.py).
    Use it as a context manager so that it is stopped whatever happens in the task."""

    def __init__(self, env, python=None):
        # Its output goes to the log in its home until a task adopts it.
        self.home, env = importable_home("tfbarrier-process-", env)
        ours, theirs = socket.socketpair()
        try:
            with atomic.private_file(os.path.join(self.home, LOG_FILE)) as log:
                proc = subprocess.Popen(
                    [python or sys.executable, "-m", "tfbarrier.spark.training_process", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=env, pass_fds=(theirs.fileno(),), preexec_fn=die_with_parent,
                )
        except BaseException:  # a keeper's stop signal too: no home left behind
            ours.close()
            shutil.rmtree(self.home, ignore_errors=True)
            raise
        finally:
            theirs.close()
        self._attach(proc, protocol.Channel(ours))

    @classmethod
    def taken_over(cls, proc, channel, home):
        """A process another one started (a spare's keeper, spares.py): ``proc`` its Popen-like handle,
        ``channel`` to the process, ``home`` its directory."""
        process = cls.__new__(cls)
        process.home = home
        process._attach(proc, channel)
        return process

    def _attach(self, proc, channel):
        self._proc, self.pid, self.channel = proc, proc.pid, channel
        self.workdir = None  # the task's work directory, from adopt() on
        self.worker_index = self.host = None
        self._oom_kills_before = None  # the host's OOM kills when the task adopted the process

    def log_tail(self):
        """The end of the process's output: in the task's work directory once it moved there."""
        return log_tail(self.workdir) or log_tail(self.home)

    def alive(self):
        return self._proc.poll() is None

    def wait(self):
        """The exit status, once the process has exited (minus the signal that killed it)."""
        return self._proc.wait()

    def send_signal(self, number):
        if self._proc.poll() is None:
            self._proc.send_signal(number)

    def adopt(self, workdir, env, worker_index, host):
        """Hand the process its task: the work directory holding the job (its output moves to the
        log there) and the task's own environment variables (the attempt)."""
        self.workdir, self.worker_index, self.host = workdir, worker_index, host
        self._oom_kills_before = faults.oom_kills()
        atomic.private_file(os.path.join(workdir, LOG_FILE), "ab").close()
        self.channel.send(protocol.JOB, workdir=workdir, env=env, previous_log=os.path.join(self.home, LOG_FILE),
                          sent_at=time.time())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def send(self, event, **fields):
        self.channel.send(event, **fields)

    def receive(self, event, timeout=None, stall_timeout=None, on_message=None, armed_by=None, setup_timeout=None):
        """Wait for the message named ``event``; other messages go to ``on_message``. Raises the
        worker's own error if it exits first, and a WorkerStalledError when no message at all
        (progress included) came for ``stall_timeout`` s. With ``armed_by`` (a test of a message), that
        watchdog starts at the first message it accepts (the first training step); until then
        ``setup_timeout`` bounds the wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last_message = started = time.monotonic()
        armed = armed_by is None
        while True:
            try:
                message = self.channel.poll(settings.CHANNEL_POLL)
            except EOFError:  # the process is ending: why, its exit status says (a spare's keeper reports it)
                self._wait_for_exit()
                raise self.failure() from None
            now = time.monotonic()
            if message is not None:
                last_message = now
                armed = armed or armed_by(message)
                if message.get("event") == event:
                    return message
                if on_message is not None:
                    on_message(message)
                continue
            if self._proc.poll() is not None:
                raise self.failure()
            if deadline is not None and now > deadline:
                raise WorkerError(
                    f"worker {self.worker_index} on {self.host} sent no {event!r} within {timeout:.0f} s",
                    worker=self.worker_index, host=self.host, log=self.log_tail(),
                )
            if not armed and setup_timeout is not None and now - started > setup_timeout:
                raise self._stalled(
                    f"did not reach its first training step within {setup_timeout:.0f} s (setting up the "
                    "strategy and the model, the first trace and step): a stuck collective, or a model whose "
                    "set-up is really that slow")
            if armed and stall_timeout is not None and now - last_message > stall_timeout:
                raise self._stalled(
                    f"made no progress for {stall_timeout:.0f} s (a stuck collective or a deadlock; if its "
                    "steps are really this slow, raise stall_timeout)")

    def _stalled(self, what):
        """The WorkerStalledError of this worker: its log ends with where each of its Python threads stood."""
        return WorkerStalledError(f"worker {self.worker_index} on {self.host} {what}; the end of its output shows "
                                  "where each of its Python threads stood", worker=self.worker_index, host=self.host,
                                  log="\n".join(part for part in (self.log_tail(), self.stacks()) if part))

    def stacks(self, wait=2.0):
        """The Python stacks of the process's threads as it dumps them on STACKS_SIGNAL, read from its log
        once the dump stops growing ("" if none came within ``wait`` s)."""
        path = os.path.join(self.workdir or self.home, LOG_FILE)
        try:
            before = size = os.path.getsize(path)
        except OSError:
            return ""
        self.send_signal(protocol.STACKS_SIGNAL)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(settings.STACKS_POLL)
            grown, size = size, os.path.getsize(path)
            if size > before and size == grown:
                break
        with open(path, "rb") as f:
            f.seek(before)
            return f.read().decode("utf-8", "replace")

    def _wait_for_exit(self):
        try:
            self._proc.wait(settings.STOP_GRACE)
        except subprocess.TimeoutExpired:  # closed its channel yet runs on: nothing more will come from it
            self._proc.kill()

    def failure(self):
        """The exception that describes why the training process exited (faults.process_failure)."""
        code = self._proc.wait()
        info = protocol.read_error(self.workdir or self.home)
        before, after = self._oom_kills_before, faults.oom_kills()
        oom_kills = after - before if None not in (before, after) else None
        return faults.process_failure(code, info, self.worker_index, self.host, self.log_tail(), oom_kills)

    def stop(self, grace=settings.STOP_GRACE):
        """Terminate the process (SIGTERM, then SIGKILL after ``grace`` seconds) and reap it."""
        self.channel.close()
        try:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(grace)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        finally:  # however the wait ends
            shutil.rmtree(self.home, ignore_errors=True)
