"""The keeper of warm start (spares.py): ``python -m tfbarrier.spark.keeper``, its spec pickled on stdin.

It listens on its executor's socket, imports TensorFlow once, and for each task of that executor that
connects forks a relay, which forks the task's training process, hands it over and passes the task's
signals on until it exits.
"""

import gc
import json
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback

from tfbarrier import atomic, faults, settings
from tfbarrier.spark import protocol, spares, training_process, workdirs
from tfbarrier.spark.launcher import TrainingProcess, die_with_parent, name_process


def _listen(path):
    """A socket listening on ``path``; None when another keeper listens there."""
    if not _abstract(path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if not workdirs.is_private(os.path.dirname(path)):  # made by another user first
            return None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)  # taken: a live keeper's (or, as a file, a killed keeper's: left unused)
    except OSError:
        listener.close()
        return None
    listener.listen(16)  # tasks that come while TensorFlow imports wait here
    return listener


def _abstract(path):
    return path.startswith("\0")


def _parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _is_taker(conn, owner):
    """Whether ``conn`` comes from a task of this keeper's executor: a process of this user whose parent
    is the executor's process ``owner`` (a task runs in a Python worker, its child)."""
    peer = spares.peer(conn)
    return peer is None or (peer[1] == os.geteuid() and _parent_of(peer[0]) == owner)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class ForkedProcess:
    """The Popen-like handle of a training process this process forked: ``pid``, ``poll``, ``wait``,
    ``send_signal``, ``terminate``, ``kill``."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    def poll(self):
        return self._reap(os.WNOHANG)

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"training process {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def _reap(self, options):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, options)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, number):
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def fork_training_process(tf, import_error, imported, inherited=()):
    """A training process forked from this one, which imported TensorFlow (at ``imported``) and ran none
    of it: it shares those pages and starts in moments. Its output goes to its own home until adopted;
    ``inherited``: sockets and descriptors of this process the training process must not keep."""
    home = workdirs.make("tfbarrier-process-")
    ours, theirs = socket.socketpair()
    log = atomic.private_file(os.path.join(home, protocol.LOG_FILE))
    parent = os.getpid()
    pid = _fork()
    if pid == 0:  # the training process
        code = faults.EXIT_FAILED
        try:
            name_process("tfb-spare")  # a training process from its first moment (not the relay it was)
            ours.close()
            _close(inherited)
            die_with_parent()
            if os.getppid() != parent:  # the relay died before that took effect
                return
            for number in spares.STOP_SIGNALS:  # as a process started afresh has them
                signal.signal(number, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            log.close()
            _reseed()
            code = training_process.run(theirs.detach(), tf, import_error, imported)
        except BaseException:  # noqa: B902 - to its log: no caller to raise to
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # never back into the keeper's code, nor its interpreter's teardown
    log.close()
    theirs.close()
    workdirs.hand_over(home, pid)
    return TrainingProcess.taken_over(ForkedProcess(pid), protocol.Channel(ours), home)


def _fork():
    """os.fork() with the stop signals held until it returns: their handler raises, and raised inside
    fork's own callbacks (logging's locks) the exception would be lost, and the signal with it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, spares.STOP_SIGNALS)
    try:
        return os.fork()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, spares.STOP_SIGNALS)


def _close(inherited):
    for item in inherited:
        if isinstance(item, int):
            os.close(item)
        else:
            item.close()


def _reseed():
    """A fork shares its parent's random state: NumPy's global one starts afresh, as in a new process
    (Python's random reseeds itself at fork)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


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
            if message is not None and message.get("event") == spares.SIGNAL:
                process.send_signal(message["signal"])
    finally:
        for fd in exits:
            os.close(fd)
    code = process.wait()
    try:
        channel.send(spares.EXITED, code=code)
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


def _relay(conn, tf, import_error, imported):
    """A relay (forked from the keeper, for one task): fork the task's training process, hand it over and
    pass its signals on; the relay's exit stops the process (PR_SET_PDEATHSIG)."""
    name_process("tfb-relay")
    # Stopped however the relay ends.
    with fork_training_process(tf, import_error, imported, inherited=(conn,)) as process:
        _serve(conn, process)


class Relays:
    """The keeper's relays, one per task it serves: each a forked child, reaped as it ends."""

    def __init__(self):
        self.pids = set()

    def start(self, conn, inherited, tf, import_error, imported):
        """Fork a relay for the task at ``conn``; ``inherited``: the keeper's descriptors it closes."""
        keeper = os.getpid()
        pid = _fork()
        if pid == 0:
            code = 1
            try:
                _close(inherited)
                die_with_parent()
                if os.getppid() != keeper:  # the keeper died before that took effect: nobody to relay for
                    return
                _relay(conn, tf, import_error, imported)
                code = 0
            finally:
                os._exit(code)
        self.pids.add(pid)

    def reap(self):
        for pid in list(self.pids):
            if os.waitpid(pid, os.WNOHANG)[0]:
                self.pids.discard(pid)
        return self.pids

    def stop(self, grace=settings.STOP_GRACE + 5.0):
        """Stop every relay (each stops its process and removes its home) and wait for them."""
        for pid in self.pids:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.reap() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in self.reap():
            os.kill(pid, signal.SIGKILL)


def _serve_takers(listener, spec, tf, import_error, imported):
    """Fork a training process for each task of the executor that connects, until the executor ends or
    nobody came for the idle timeout with none running. Wakes at the executor's exit where the OS can
    tell, else looks twice a second."""
    owner, relays = spec["owner"], Relays()
    exits = _exit_fds(owner)
    deadline = time.monotonic() + spec["idle_timeout"]
    try:
        while _alive(owner):
            if relays.reap():
                deadline = time.monotonic() + spec["idle_timeout"]
            left = deadline - time.monotonic()
            if left <= 0:
                return
            tick = 0.5 if relays.pids or not exits else left
            ready = select.select([listener] + exits, [], [], min(left, tick))[0]
            if listener in ready:
                conn, _ = listener.accept()
                if _is_taker(conn, owner):
                    relays.start(conn, [listener, *exits], tf, import_error, imported)
                    deadline = time.monotonic() + spec["idle_timeout"]
                conn.close()  # the relay's now, or another user's or executor's: sent away
            elif ready:  # the executor exited (it may stay a zombie a while: os.kill still finds it)
                return
    finally:
        relays.stop()
        for fd in exits:
            os.close(fd)


def keep(spec):
    path = spares.address(spec["python"], spec["env"], spec["idle_timeout"], spec["owner"])
    listener = _listen(path)
    if listener is None:
        return
    try:
        tf, import_error = training_process.import_tensorflow()  # once, for every process it forks
        # What was imported stays: out of the collector's sight, a fork's collections do not write to (and so
        # copy) every page of it.
        gc.freeze()
        _serve_takers(listener, spec, tf, import_error, time.time())
    finally:
        listener.close()
        if not _abstract(path):
            os.unlink(path)


def _exit_on(number, frame):
    for other in spares.STOP_SIGNALS:  # once: a second signal (SIGHUP, then SIGTERM) must not cut the cleanup short
        signal.signal(other, signal.SIG_IGN)
    raise SystemExit(128 + number)


def main():
    spec = pickle.load(sys.stdin.buffer)
    name_process("tfb-keeper")
    for number in spares.STOP_SIGNALS:  # the daemon's SIGHUP at shutdown: clean up, exit
        signal.signal(number, _exit_on)
    try:
        keep(spec)
    finally:
        shutil.rmtree(spec["home"], ignore_errors=True)


if __name__ == "__main__":
    main()
