"""Live progress and logs on the driver while a job runs, and the fast rendezvous.

The driver opens a small TCP server on its own address for the duration of a job; every task
connects back, authenticates with the job's secret token and streams JSON lines: its events
(bootstrap, rendezvous), its training process's progress (steps, epoch metrics) and, at verbose=2,
its output lines. What the driver shows depends on ``verbose``: 0 nothing, 1 one progress bar for
the whole job plus a line per epoch, 2 also every worker's log lines. If a task cannot reach the
server, training goes on and the driver warns that progress is unavailable.

The same connection carries the tasks' rendezvous (``Reporter.gather``): Spark's allGather waits in
whole seconds (its task thread sleeps 1 s between checks), the driver answers within milliseconds.
When some task cannot reach the driver, every task is told to fall back to allGather.
"""

import json
import secrets
import socket
import socketserver
import sys
import threading
import time
import warnings

CONNECT_TIMEOUT = 5.0
RENDEZVOUS_WAIT = 30.0  # s from a rendezvous' first arrival until every task falls back to allGather


class ProgressUnavailableWarning(UserWarning):
    """No worker could send progress to the driver (a firewall between executors and driver?)."""


class _Handler(socketserver.StreamRequestHandler):
    def handle(self):
        server = self.server.owner
        first = self.rfile.readline()
        try:
            hello = json.loads(first)
        except ValueError:
            hello = {}
        if not secrets.compare_digest(str(hello.get("token", "")), server.token):
            server.rejected += 1
            return  # closing the connection is the answer
        for line in self.rfile:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("kind") == "rendezvous":
                server.rendezvous(message, self._reply)
            else:
                server.receive(message)

    def _reply(self, message):
        try:
            self.wfile.write(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the task is gone; its stage fails without the driver's help


class _Gathering:
    """One rendezvous (one submission of the job): the list of every task's info once all arrived,
    or, ``wait`` seconds after the first arrival, a fallback for all (including late arrivals)."""

    def __init__(self, size, wait):
        self.size = size
        self.infos, self.replies, self.outcome = {}, [], None
        self._lock = threading.Lock()
        self._timer = threading.Timer(wait, self._finish, [{"fallback": True}])
        self._timer.daemon = True
        self._timer.start()

    def arrive(self, worker, info, reply):
        with self._lock:
            if self.outcome is None:
                self.infos[worker] = info
                self.replies.append(reply)
                if len(self.infos) == self.size:
                    self._finish_locked({"peers": [self.infos[i] for i in range(self.size)]})
                return
        reply(self.outcome)

    def _finish(self, outcome):
        with self._lock:
            if self.outcome is None:
                self._finish_locked(outcome)

    def _finish_locked(self, outcome):
        self.outcome = outcome
        self._timer.cancel()
        for reply in self.replies:
            reply(outcome)
        self.replies = []

    def cancel(self):
        self._timer.cancel()


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class ProgressServer:
    """The driver's end. ``events`` keeps every accepted message with its arrival time."""

    def __init__(self, host, verbose=1, workers=None, global_batch=None, out=None, rendezvous_wait=RENDEZVOUS_WAIT):
        self.token = secrets.token_hex(16)
        self.verbose = verbose
        self.global_batch = global_batch
        self.workers = workers  # tasks in a rendezvous; None: no rendezvous through this server
        self.rendezvous_wait = rendezvous_wait
        self._gatherings = {}
        self.out = out or sys.stderr
        self.events = []
        self.rejected = 0
        self._lock = threading.Lock()
        self._bar = None
        self._first = None  # (time, steps) of the chief's first step report: the rate starts there
        self._postfix = {}  # the bar's last loss and rate, kept across messages that lack one
        self._server = _TCPServer((host, 0), _Handler)
        self._server.owner = self
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="tfbarrier-progress", daemon=True)
        self._thread.start()

    @property
    def endpoint(self):
        return {"host": self.host, "port": self.port, "token": self.token}

    def receive(self, message):
        message["received_at"] = time.time()
        with self._lock:
            self.events.append(message)
            if self.verbose:
                self._show(message)

    def rendezvous(self, message, reply):
        """A task's info for its submission (``attempt``); ``reply`` gets {"peers": [...]} or
        {"fallback": true} (see _Gathering)."""
        worker = message.get("worker")
        if self.workers is None or not isinstance(worker, int) or not 0 <= worker < self.workers:
            reply({"fallback": True})
            return
        with self._lock:
            gathering = self._gatherings.get(message.get("attempt"))
            if gathering is None:
                gathering = self._gatherings[message.get("attempt")] = _Gathering(self.workers, self.rendezvous_wait)
        gathering.arrive(worker, message.get("info"), reply)

    def _show(self, message):
        kind, worker = message.get("kind"), message.get("worker")
        if kind == "log" and self.verbose >= 2:
            self._write(f"[worker {worker}] {message['line']}")
        elif kind == "event" and self.verbose >= 2:
            self._write(f"[worker {worker}] {message['event']}")
        elif kind == "progress" and worker == 0:
            self._progress(message)

    def _progress(self, message):
        from tqdm.auto import tqdm

        total = message.get("total_steps")
        if self._bar is None and total:
            self._bar = tqdm(total=total, unit="step", file=self.out, dynamic_ncols=True, leave=True)
        if self._bar is None:
            return
        steps = message.get("steps", 0)
        self._bar.update(max(0, steps - self._bar.n))
        postfix = self._postfix
        if message.get("loss") is not None:
            postfix["loss"] = f"{message['loss']:.4f}"
        now = message["received_at"]
        if self._first is None and steps:
            self._first = (now, steps)
        elif self._first and self.global_batch and now > self._first[0]:
            rate = (steps - self._first[1]) * self.global_batch / (now - self._first[0])
            postfix["samples/s"] = f"{rate:,.0f}"
        self._bar.set_postfix(postfix, refresh=False)
        if message.get("epoch") is not None and message.get("logs"):
            metrics = "  ".join(f"{k} {v:.4f}" for k, v in message["logs"].items())
            self._write(f"epoch {message['epoch'] + 1}: {metrics}")

    def _write(self, text):
        if self._bar is not None:
            self._bar.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    def workers_heard(self):
        return {m.get("worker") for m in self.events}

    def close(self):
        for gathering in self._gatherings.values():
            gathering.cancel()
        self._server.shutdown()
        self._server.server_close()
        if self._bar is not None:
            self._bar.close()
        if not self.workers_heard() and self.verbose:
            warnings.warn(
                f"no progress reached the driver from the workers (they could not connect to "
                f"{self.host}:{self.port}; a firewall?): training ran, but without live progress",
                ProgressUnavailableWarning, stacklevel=3,
            )


class Reporter:
    """A task's end: sends events, progress and log lines; silently does nothing when the driver
    cannot be reached (training must not depend on it)."""

    def __init__(self, endpoint, worker):
        self.worker = worker
        self._lock = threading.Lock()
        self._closed = threading.Event()  # stops the log followers
        self._sock = self._replies = None
        if not endpoint:
            return
        try:
            self._sock = socket.create_connection((endpoint["host"], endpoint["port"]), timeout=CONNECT_TIMEOUT)
            self._sock.settimeout(None)
            self._sock.sendall(json.dumps({"token": endpoint["token"]}).encode() + b"\n")
            self._replies = self._sock.makefile("rb")
        except OSError:
            self._sock = None

    def gather(self, attempt, info):
        """Every task's ``info``, in task order, through the driver; None when the driver cannot
        provide it (unreachable from here or from another task): the caller then uses Spark's
        allGather, as every other task of the rendezvous will."""
        if self._sock is None:
            return None
        self.send("rendezvous", attempt=attempt, info=info)
        try:
            line = self._replies.readline()  # the driver answers within RENDEZVOUS_WAIT
            return json.loads(line).get("peers") if line else None
        except (OSError, ValueError, AttributeError):
            return None

    def send(self, kind, **fields):
        if self._sock is None:
            return
        line = json.dumps({"kind": kind, "worker": self.worker, "sent_at": time.time(), **fields}).encode() + b"\n"
        with self._lock:
            try:
                self._sock.sendall(line)
            except OSError:
                self._sock = None

    def event(self, name, **fields):
        self.send("event", event=name, **fields)

    def log(self, line):
        self.send("log", line=line)

    def follow(self, path):
        """Send the lines appended to ``path`` until the reporter is closed (in a thread of its own)."""

        def run():
            with open(path, "rb") as f:
                while True:
                    line = f.readline()
                    if line:
                        self.log(line.decode("utf-8", "replace").rstrip())
                    elif self._closed.is_set():
                        return
                    else:
                        time.sleep(0.2)

        thread = threading.Thread(target=run, name="tfbarrier-log-follower", daemon=True)
        thread.start()
        return thread

    def close(self):
        self._closed.set()
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
