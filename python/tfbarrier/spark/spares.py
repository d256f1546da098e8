"""Warm start: a keeper that has imported TensorFlow forks a training process for each next task on its
executor.

Importing TensorFlow is most of a training process's start-up (3.5-5.5 CPU-seconds here, whatever the
model). A task that succeeded leaves a *keeper* (``python -m tfbarrier.spark.keeper``, keeper.py, in the training
processes' Python and environment): it imports TensorFlow once and runs none of it, so a fork of it is as
good as a fresh process for any task whose Python and environment match, and costs moments instead of
seconds. The keeper listens on a Unix socket named after the executor and that match (in Linux's abstract
namespace, elsewhere in a directory of the temporary directory only this user enters); for each task that
connects it forks a *relay* (``tfb-relay``), which forks the training process, hands the task its channel
(SCM_RIGHTS) and from then on passes the task's signals to it and reports how it exited (only a parent
learns that). A task asks first and takes the process once its shard is written (``request``, then
``Handover.receive``): from a keeper that still imports TensorFlow, once it is done, as from a new process.

Only a task of its own executor gets a process. An abstract socket has no file permissions and its name is
listed in the world-readable /proc/net/unix, so the keeper asks the kernel who connected (SO_PEERCRED):
a process of another user, or one that is not a child of the executor's process (a Python worker of that
executor), is sent away and the keeper waits on. The task asks the same of the keeper (a socket of
another user's squatting the name is not taken), and the process it gets loads its job only from a work
directory no other user can write (workdirs.is_private).

Spark retires a Python worker after a minute without tasks, and a keeper that died with it would leave
every fit after a pause cold. So a keeper belongs to the executor (the Python worker's parent: Spark's
Python daemon, or the executor itself without one) and dies with it: it watches that process, and
the daemon's SIGHUP to its process group at shutdown reaches it. A keeper nobody comes to exits after
``spark.tfbarrier.spareIdleTimeout`` seconds (600) with none of its processes running; a relay whose task
dies kills the process (the task's end closes the socket). A relay dies with its keeper and a training
process with its relay (PR_SET_PDEATHSIG). ``spark.tfbarrier.warmStart=false`` turns warm start off.
"""

import hashlib
import json
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from tfbarrier import settings
from tfbarrier.spark import protocol, workdirs
from tfbarrier.spark.launcher import TrainingProcess, importable_home

EXITED = "exited"  # keeper -> task: the training process exited, with its ``code``
SIGNAL = "signal"  # task -> keeper: send the process ``signal``
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # the keeper cleans up and exits on either


def address(python, env, idle_timeout, owner):
    """The socket path of the keeper for this Python, environment and idle timeout, for the executor
    process ``owner``."""
    match = hashlib.sha256(repr((python, sorted(env.items()), float(idle_timeout))).encode()).hexdigest()[:16]
    base = f"tfbarrier-spares-{os.getuid()}-{owner}"
    if sys.platform.startswith("linux"):  # the abstract namespace: no file to leave behind, no long path
        base = "\0" + base
    else:
        base = os.path.join(tempfile.gettempdir(), base)
    return f"{base}/{match}"


def request(python, env, idle_timeout):
    """Ask this executor's keeper for ``python``, ``env`` and ``idle_timeout`` for a training process: its
    Handover, or None when there is no keeper (or the socket under its name is another user's)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(settings.SPARE_HANDOVER)
    try:
        conn.connect(address(python, env, idle_timeout, os.getppid()))
    except OSError:
        conn.close()
        return None
    if not _same_user(conn):
        conn.close()
        return None
    return Handover(conn)


def _a_process_home(path):
    """Whether ``path`` is what a keeper hands over as its process's home: a private tfbarrier directory made
    for a process (workdirs.py)."""
    return (isinstance(path, str) and os.path.basename(path).startswith("tfbarrier-process-")
            and workdirs.is_private(path))


class Handover:
    """A training process a keeper is forking for this task: asked for first, received once the task has
    done what it can meanwhile (a keeper that still imports TensorFlow hands it over when done)."""

    def __init__(self, conn):
        self._conn = conn

    def arrived(self):
        """Whether the keeper has handed the process over already (it had imported TensorFlow)."""
        return bool(select.select([self._conn], [], [], 0)[0])

    def receive(self):
        """The training process, or None when the keeper failed to hand one over."""
        conn, self._conn = self._conn, None
        try:
            data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
        except OSError:  # the keeper ended (its idle timeout ran out as the task came), or took too long
            conn.close()
            return None
        if not data or not fds:
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        conn.settimeout(None)
        handed = json.loads(data)
        if not _a_process_home(handed.get("home")):  # the task removes it when the process ends: only such a one
            os.close(fds[0])
            conn.close()
            return None
        channel = protocol.Channel(socket.socket(fileno=fds[0]))
        return TrainingProcess.taken_over(KeptProcess(conn, handed["pid"]), channel, handed["home"])

    def close(self):
        """Not taken after all (the task failed first): the keeper's relay stops the process it forked."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def leave(python, env, idle_timeout=settings.SPARE_IDLE_TIMEOUT):
    """Start a keeper for the next tasks like this one on this executor, in the training processes'
    Python and environment: it imports TensorFlow in the background, then forks a training process for
    each task that comes. Nothing when one keeps spares for them already."""
    home, keeper_env = importable_home("tfbarrier-keeper-", env)
    spec = {"python": python, "env": env, "owner": os.getppid(), "idle_timeout": idle_timeout, "home": home}
    # Not waited for: Python reaps a finished child when it starts the next one.
    keeper = subprocess.Popen([python or sys.executable, "-m", "tfbarrier.spark.keeper"], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=keeper_env)
    workdirs.hand_over(home, keeper.pid)  # the keeper removes it, and outlives this task
    keeper.stdin.write(pickle.dumps(spec))
    keeper.stdin.close()


class KeptProcess:
    """The Popen-like handle of a task on the spare it took: the keeper, the process's parent, passes
    its signals on and reports the process's exit status (minus the signal that killed it)."""

    def __init__(self, conn, pid):
        self._channel = protocol.Channel(conn)
        self.pid = pid
        self.returncode = None

    def poll(self):
        return self._wait(0)

    def wait(self, timeout=None):
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"training process {self.pid}", timeout)
        return code

    def _wait(self, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                message = self._channel.poll(left)
            except (EOFError, OSError):  # the keeper died, and its process with it (PR_SET_PDEATHSIG)
                message = {"event": EXITED, "code": -signal.SIGKILL}
            if message is None:
                return None
            if message.get("event") == EXITED:
                self.returncode = message["code"]
                self._channel.close()
        return self.returncode

    def send_signal(self, number):
        if self.returncode is None:
            try:
                self._channel.send(SIGNAL, signal=int(number))
            except OSError:
                pass

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def peer(conn):
    """(pid, uid) of the process at the other end of the Unix socket ``conn``, as the kernel saw it
    connect; None where the OS has no SO_PEERCRED (there the socket is a file in a directory of this
    user's only)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    return pid, uid


def _same_user(conn):
    found = peer(conn)
    return found is None or found[1] == os.geteuid()
