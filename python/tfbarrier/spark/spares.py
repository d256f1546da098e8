"""Warm start: spare training processes that have imported TensorFlow wait for the next tasks on
their executor.

Importing TensorFlow is most of a training process's start-up (about 3 s of a cold fit's time to
first step on the benchmark machine). A task that succeeded leaves a spare: a small *keeper* process
(``python -m tfbarrier.spark.spares``) that starts a training process, which imports TensorFlow and waits
for a job, nothing more (no strategy, TF_CONFIG or thread settings), so it is as good as a fresh
process for any task whose Python and environment match. The keeper listens on a Unix socket named
after the executor and that match (in Linux's abstract namespace, elsewhere in a directory of the temporary
directory only this user enters), in one of a slot per CPU; a task connects, the keeper hands it the process's channel (SCM_RIGHTS) and from
then on passes the task's signals to the process and reports how it exited (the process is the
keeper's child: only its parent learns that).

Only a task of its own executor gets a spare. An abstract socket has no file permissions and its name is
listed in the world-readable /proc/net/unix, so the keeper asks the kernel who connected (SO_PEERCRED):
a process of another user, or one that is not a child of the executor's process (a Python worker of that
executor), is sent away and the keeper waits on. The task asks the same of the keeper (a socket of
another user's squatting the name is not taken), and the process it gets loads its job only from a work
directory no other user can write (workdirs.is_private).

Spark retires a Python worker after a minute without tasks, and a spare that died with it would leave
every fit after a pause cold. So a keeper belongs to the executor (the Python worker's parent: Spark's
Python daemon, or the executor itself without one) and dies with it: it watches that process, and
the daemon's SIGHUP to its process group at shutdown reaches it. A keeper nobody takes exits after
``spark.tfbarrier.spareIdleTimeout`` seconds (600); one whose task dies kills the process (the task's
end closes the socket). A training process dies with its keeper (PR_SET_PDEATHSIG).
``spark.tfbarrier.warmStart=false`` turns spares off.
"""

import hashlib
import json
import os
import pickle
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from tfbarrier import settings
from tfbarrier.spark import protocol, workdirs
from tfbarrier.spark.launcher import TrainingProcess, importable_home, name_process

EXITED = "exited"  # keeper -> task: the training process exited, with its ``code``
SIGNAL = "signal"  # task -> keeper: send the process ``signal``
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # the keeper cleans up and exits on either


def _slots(python, env, owner):
    """The socket paths a spare for this Python and environment may listen on, for the executor
    process ``owner``: one per CPU, so that every concurrent task can leave one."""
    match = hashlib.sha256(repr((python, sorted(env.items()))).encode()).hexdigest()[:16]
    base = f"tfbarrier-spares-{os.getuid()}-{owner}"
    if sys.platform.startswith("linux"):  # the abstract namespace: no file to leave behind, no long path
        base = "\0" + base
    else:
        base = os.path.join(tempfile.gettempdir(), base)
    return [f"{base}/{match}-{slot}" for slot in range(max(2, os.cpu_count() or 2))]


def take(python, env):
    """A spare training process of this executor for ``python`` and ``env``, or None."""
    for path in _slots(python, env, os.getppid()):
        process = _take_from(path)
        if process is not None:
            return process
    return None


def _take_from(path):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(settings.SPARE_HANDOVER)
        conn.connect(path)
        if not _same_user(conn):  # another user's socket under a spare's name
            conn.close()
            return None
        data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
    except OSError:  # no spare there (any more), or it is handing itself to another task
        conn.close()
        return None
    if not data or not fds:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    conn.settimeout(None)
    spare = json.loads(data)
    channel = protocol.Channel(socket.socket(fileno=fds[0]))
    return TrainingProcess.taken_over(KeptProcess(conn, spare["pid"]), channel, spare["home"])


def leave(python, env, idle_timeout=settings.SPARE_IDLE_TIMEOUT):
    """Start a spare for the next task like this one on this executor: its keeper starts the process,
    which imports TensorFlow, in the background. Nothing when every slot holds a spare already."""
    home, keeper_env = importable_home("tfbarrier-keeper-", dict(os.environ))
    spec = {"python": python, "env": env, "owner": os.getppid(), "idle_timeout": idle_timeout, "home": home}
    # Not waited for: Python reaps a finished child when it starts the next one.
    keeper = subprocess.Popen([sys.executable, "-m", "tfbarrier.spark.spares"], stdin=subprocess.PIPE,
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


# ---- the keeper: python -m tfbarrier.spark.spares, its spec pickled on stdin ----------------------------

def _listen(slots):
    """A socket listening on the first free slot, and its path; (None, None) when none is free."""
    if not _abstract(slots[0]):
        os.makedirs(os.path.dirname(slots[0]), mode=0o700, exist_ok=True)
        if not workdirs.is_private(os.path.dirname(slots[0])):  # made by another user first
            return None, None
    for path in slots:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)  # taken: a live spare's (or, as a file, a killed keeper's: left unused)
        except OSError:
            listener.close()
            continue
        listener.listen(1)
        return listener, path
    return None, None


def _abstract(path):
    return path.startswith("\0")


def _peer(conn):
    """(pid, uid) of the process at the other end of the Unix socket ``conn``, as the kernel saw it
    connect; None where the OS has no SO_PEERCRED (there the socket is a file in a directory of this
    user's only)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    return pid, uid


def _same_user(conn):
    peer = _peer(conn)
    return peer is None or peer[1] == os.geteuid()


def _parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _is_taker(conn, owner):
    """Whether ``conn`` comes from a task of this keeper's executor: a process of this user whose parent
    is the executor's process ``owner`` (a task runs in a Python worker, its child)."""
    peer = _peer(conn)
    return peer is None or (peer[1] == os.geteuid() and _parent_of(peer[0]) == owner)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _wait_for_taker(listener, process, owner, idle_timeout):
    """The connection of the task that takes the spare; None when the executor or the process ended,
    or nobody came in time. Wakes at either's exit where the OS can tell, else looks twice a second."""
    deadline = time.monotonic() + idle_timeout
    exits = _exit_fds(owner, process.pid)
    tick = None if len(exits) == 2 else 0.5
    try:
        while _alive(owner) and process.alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready = select.select([listener] + exits, [], [], left if tick is None else min(left, tick))[0]
            if listener in ready:
                conn, _ = listener.accept()
                if _is_taker(conn, owner):
                    return conn
                conn.close()  # another user's process, or not this executor's: the spare waits on
                continue
            if ready:  # an exit (the executor's may stay a zombie a while: os.kill still finds it)
                return None
        return None
    finally:
        for fd in exits:
            os.close(fd)


def _serve(conn, process):
    """Hand ``process`` to the task at ``conn``, then pass its signals on until the process exits."""
    socket.send_fds(conn, [json.dumps({"pid": process.pid, "home": process.home}).encode()],
                    [process.channel.fileno()])
    process.channel.close()  # the task's now
    channel = protocol.Channel(conn)
    # The task learns of a crash from here: wake at the exit itself where the OS can tell (a peer's
    # error follows within moments, and the first error a task raises is the one the user sees).
    exits = _exit_fds(process.pid)
    try:
        while process.alive():
            if conn not in select.select([conn] + exits, [], [], None if exits else 0.2)[0]:
                continue
            try:
                message = channel.poll(0)
            except (EOFError, OSError):  # the task is gone: its process goes with it
                process.send_signal(signal.SIGKILL)
                break
            if message is not None and message.get("event") == SIGNAL:
                process.send_signal(message["signal"])
    finally:
        for fd in exits:
            os.close(fd)
    code = process.wait()
    try:
        channel.send(EXITED, code=code)
    except OSError:
        pass


def _exit_fds(*pids):
    """Descriptors that become readable when these processes exit (Linux's pidfds), for those the OS
    gives one: fewer than ``pids`` means looking at the others from time to time."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except (AttributeError, OSError):
            pass
    return fds


def keep(spec):
    listener, path = _listen(_slots(spec["python"], spec["env"], spec["owner"]))
    if listener is None:
        return
    with TrainingProcess(spec["env"], spec["python"]) as process:  # stopped however the keeper ends
        try:
            conn = _wait_for_taker(listener, process, spec["owner"], spec["idle_timeout"])
        finally:
            listener.close()
            if not _abstract(path):
                os.unlink(path)
        if conn is not None:
            _serve(conn, process)


def _exit_on(number, frame):
    for other in STOP_SIGNALS:  # once: a second signal (SIGHUP, then SIGTERM) must not cut the cleanup short
        signal.signal(other, signal.SIG_IGN)
    raise SystemExit(128 + number)


def main():
    spec = pickle.load(sys.stdin.buffer)
    name_process("tfb-keeper")
    for number in STOP_SIGNALS:  # the daemon's SIGHUP at shutdown: clean up, exit
        signal.signal(number, _exit_on)
    try:
        keep(spec)
    finally:
        shutil.rmtree(spec["home"], ignore_errors=True)


if __name__ == "__main__":
    main()
