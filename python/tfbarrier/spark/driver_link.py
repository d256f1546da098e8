"""The link between the driver and its tasks while a job runs: a small TCP server on the driver's
address (``DriverServer``) and each task's connection to it (``DriverLink``).

A task connects back, sends the job's secret token first (a connection without it is closed), then
JSON lines, each a message with a ``kind`` and the task's ``worker`` index, one way: events, progress
and log lines, which the server keeps (``events``) and hands to ``on_message`` (the progress display).
A request (``DriverLink.request``, the rendezvous) goes on a connection of its own and gets one line back
from the handler of its kind, which may answer from another thread: that connection's own thread writes
the answer, so no connection is ever read and written at once (a TLS socket must not be). Messages are a
convenience, never a dependency: a task that cannot reach the driver trains on, its sends do nothing and
its requests answer None.

With the job's TLS credentials (job_tls.py: the cluster encrypts), every connection is TLS from its first
byte, the token inside; a connection whose handshake fails counts as refused, like a wrong token.

Files go over connections of their own, the token first as well: ``fetch`` streams a file the
server offers (the model's weights, transfer.py) into a file of the task's, ``put`` streams a task's
file (the trained weights) into one the server takes. Neither holds a file in memory: the driver
sends from disk (``socket.sendfile``, a read-and-send loop over TLS) and both sides write as the bytes come.
"""

import contextlib
import json
import os
import queue
import secrets
import socket
import socketserver
import ssl
import sys
import threading
import time

from tfbarrier import atomic, settings
from tfbarrier.exchange.tls import describe

COPY_CHUNK = 2**20  # bytes read and written at a time while a file streams in


class _Handler(socketserver.StreamRequestHandler):
    def setup(self):
        tls = self.server.owner.tls
        if tls is not None:  # the handshake runs here, in the connection's thread: a stranger holds up no other
            self.request.settimeout(settings.CONNECT_TIMEOUT)
            self.request = tls.server(self.request)
            self.request.settimeout(None)
        super().setup()

    def handle(self):
        server = self.server.owner
        try:
            hello = json.loads(self.rfile.readline())
        except ValueError:
            hello = {}
        if not isinstance(hello, dict) or not secrets.compare_digest(str(hello.get("token", "")), server.token):
            server.rejected += 1
            return  # closing the connection is the answer
        if "fetch" in hello:
            self._send_file(server.files, hello["fetch"])
        elif "put" in hello:
            self._receive_file(server.files, hello["put"], hello.get("size"))
        elif isinstance(hello.get("request"), dict):
            self._answer_request(server, hello["request"])
        else:
            self._messages(server)

    def finish(self):
        super().finish()
        self.request.close()  # the TLS socket (the server closes only the plain one it accepted)

    def _send_file(self, files, name):
        path = files.served(name) if files is not None else None
        if path is None:
            self._reply({"error": f"the driver offers no file {name!r}"})
            return
        with open(path, "rb") as f:
            self._reply({"size": os.fstat(f.fileno()).st_size})
            self.connection.sendfile(f)

    def _receive_file(self, files, name, size):
        path = files.receiving(name) if files is not None else None
        if path is None or not isinstance(size, int):
            self._reply({"error": f"the driver takes no file {name!r}"})
            return
        _copy(self.rfile, path, size)
        self._reply({"received": size})

    def _answer_request(self, server, message):
        answers = queue.Queue(maxsize=1)
        server.dispatch(message, answers.put)
        try:
            self._reply(answers.get(timeout=settings.REQUEST_ANSWER_TIMEOUT))
        except queue.Empty:
            pass  # the job ended unanswered: closing the connection tells the task

    def _messages(self, server):
        for line in self.rfile:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            server.dispatch(message, self._reply)

    def _reply(self, message):
        try:
            self.wfile.write(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the task is gone; its stage fails without the driver's help


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ssl.SSLError, ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)  # the driver's own trouble (a full disk...): printed
        self.owner.rejected += 1  # a failed TLS handshake, or a task gone mid-message


class DriverServer:
    """The driver's end. ``requests`` maps a request kind to ``handler(message, reply)``; every other
    message is kept in ``events`` (with its arrival time) and passed to ``on_message``. ``files``
    (a transfer.JobFiles) says which files are fetched from where (``served(name)``: a path or None) and
    where the files tasks put go (``receiving(name)``)."""

    def __init__(self, host, on_message=None, requests=None, files=None, tls=None):
        self.token, self.tls = secrets.token_hex(16), tls
        self.on_message = on_message
        self.requests = dict(requests or {})
        self.files = files
        self.events = []
        self.rejected = 0
        self._lock = threading.Lock()
        self._server = _TCPServer((host, 0), _Handler)
        self._server.owner = self
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="tfbarrier-link", daemon=True)
        self._thread.start()

    @property
    def endpoint(self):
        """What a task needs to connect: host, port, token, and the certificate it trusts (TLS) or None."""
        return {"host": self.host, "port": self.port, "token": self.token,
                "tls": self.tls and self.tls.pinned()}

    def dispatch(self, message, reply):
        handler = self.requests.get(message.get("kind"))
        if handler is not None:
            handler(message, reply)
            return
        message["received_at"] = time.time()
        with self._lock:
            self.events.append(message)
            if self.on_message is not None:
                self.on_message(message)

    def workers_heard(self):
        return {m.get("worker") for m in self.events}

    def close(self):
        self._server.shutdown()
        self._server.server_close()


class DriverLink:
    """A task's end. Thread-safe; silently does nothing when the driver cannot be reached."""

    def __init__(self, endpoint, worker):
        self.worker = worker
        self._lock = threading.Lock()
        self._closed = threading.Event()  # stops the log followers
        self._followers = []
        self._endpoint = endpoint
        self._sock = None
        if not endpoint:
            return
        try:
            self._sock = _connect(endpoint)
            self._sock.settimeout(None)
            self._sock.sendall(json.dumps({"token": endpoint["token"]}).encode() + b"\n")
        except OSError:
            self._sock = None

    def _message(self, kind, fields):
        return {"kind": kind, "worker": self.worker, "sent_at": time.time(), **fields}

    def send(self, kind, **fields):
        if self._sock is None:
            return
        line = json.dumps(self._message(kind, fields)).encode() + b"\n"
        with self._lock:
            try:
                self._sock.sendall(line)
            except OSError:
                self._sock = None

    def request(self, kind, **fields):
        """Send a request on a connection of its own and wait for the driver's one-line answer (its
        handler must answer); None when the driver cannot be reached or did not answer."""
        if self._sock is None:
            return None
        try:
            with _file_connection(self._endpoint, request=self._message(kind, fields)) as (sock, answers):
                sock.settimeout(settings.REQUEST_ANSWER_TIMEOUT)
                line = answers.readline()
            return json.loads(line) if line else None
        except (OSError, ValueError):
            return None

    def event(self, name, **fields):
        self.send("event", event=name, **fields)

    @property
    def connected(self):
        return self._sock is not None

    @property
    def encryption(self):
        """The TLS version and cipher of this link, or None: plain TCP, or no link."""
        return describe(self._sock)

    def fetch(self, name, path):
        """Stream the driver's file ``name`` into ``path``; its size. Raises OSError when it cannot."""
        return fetch(self._endpoint, name, path)

    def put(self, name, path):
        """Stream the file at ``path`` to the driver as ``name``; its size. Raises OSError when it cannot."""
        size = os.path.getsize(path)
        with _file_connection(self._endpoint, put=name, size=size) as (sock, answers):
            with open(path, "rb") as f:
                sock.sendfile(f)
            _answer(answers, name)
        return size

    def follow(self, path):
        """Send the lines appended to ``path`` as ``log`` messages, in a thread of its own, until the link
        is closed (and the file's last lines are sent)."""

        def run():
            with open(path, "rb") as f:
                while True:
                    line = f.readline()
                    if line:
                        self.send("log", line=line.decode("utf-8", "replace").rstrip())
                    elif self._closed.is_set():
                        return
                    else:
                        time.sleep(settings.FILE_POLL)

        thread = threading.Thread(target=run, name="tfbarrier-log-follower", daemon=True)
        thread.start()
        self._followers.append(thread)
        return thread

    def close(self):
        self._closed.set()
        for thread in self._followers:
            thread.join(settings.LOG_DRAIN)
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


@contextlib.contextmanager
def _file_connection(endpoint, **hello):
    """A connection of its own for one file, the hello sent: (socket, a reader of its answers)."""
    if not endpoint:
        raise ConnectionError("the job has no driver link")
    with _connect(endpoint) as sock:
        sock.settimeout(settings.TRANSFER_IDLE_TIMEOUT)
        sock.sendall(json.dumps({"token": endpoint["token"], **hello}).encode() + b"\n")
        with sock.makefile("rb") as answers:
            yield sock, answers


def _connect(endpoint):
    """A connection to the driver's link, TLS when its endpoint pins a certificate."""
    sock = socket.create_connection((endpoint["host"], endpoint["port"]), timeout=settings.CONNECT_TIMEOUT)
    tls = endpoint.get("tls")
    if tls is None:
        return sock
    try:
        return tls.client(sock)
    except OSError:
        sock.close()
        raise


def _answer(answers, name):
    """The server's one-line answer about file ``name``; an OSError when it refused or said nothing."""
    line = answers.readline()
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "error" in answer:
        why = answer["error"] if isinstance(answer, dict) else "the connection closed"
        raise ConnectionError(f"file {name!r}: {why}")
    return answer


def fetch(endpoint, name, path):
    """Stream the file ``name`` offered by the DriverServer at ``endpoint`` into ``path``, written aside
    and renamed into place once whole; its size. Raises OSError (ConnectionError...) when it cannot."""
    with _file_connection(endpoint, fetch=name) as (sock, answers):
        size = _answer(answers, name)["size"]
        _copy(answers, path, size)
    return size


def _copy(source, path, size):
    """``size`` bytes of ``source`` (a binary reader) into a new file at ``path``, a chunk at a time."""
    with atomic.written_aside(path) as f:
        left = size
        while left:
            chunk = source.read(min(COPY_CHUNK, left))
            if not chunk:
                raise ConnectionError(f"the connection closed {size - left} of {size} bytes into {path!r}")
            f.write(chunk)
            left -= len(chunk)
