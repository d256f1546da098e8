"""The link between the driver and its tasks while a job runs: a small TCP server on the driver's
address (``DriverServer``) and each task's connection to it (``DriverLink``).

Every connection proves that it holds the job's token before anything is read from it, without sending
the token: the server sends a fresh nonce, the task answers with its hello (what the connection is for)
and an HMAC-SHA256 of the nonce and that hello under the token (link_wire.py), so what crosses the wire
neither admits anyone else nor replays. Until then a connection is a stranger's: its hello is read within
CONNECT_TIMEOUT and at most link_wire.HELLO_LIMIT bytes, and only as many wait at once as a waiting room takes
(waiting_room.py); more are closed on arrival, counted by address (``strangers``), and start no thread. Then JSON lines, each a message with a ``kind`` and the task's ``worker`` index, one way:
events, progress and log lines, which the server keeps (``events``) and hands to ``on_message`` (the
progress display). A request (``DriverLink.request``, the rendezvous) goes on a connection of its own and
gets one line back from the handler of its kind, which may answer from another thread: that connection's
own thread writes the answer, so no connection is ever read and written at once (a TLS socket must not
be). Messages are a convenience, never a dependency: a task that cannot reach the driver trains on, its
sends do nothing and its requests answer None.

With the job's TLS credentials (tls.py: the cluster encrypts), every connection is TLS from its first
byte, the proof inside; a connection whose handshake fails counts as refused, like a wrong proof.

Files go over connections of their own, proved as well: ``fetch`` streams a file the server offers (the
model's weights, transfer.py) into a file of the task's, ``put`` streams a task's file (the trained
weights) into one the server takes. Neither holds a file in memory: the driver sends from disk
(``socket.sendfile``, a read-and-send loop over TLS) and both sides write as the bytes come, hashing them
(SHA-256): a fetched file whose digest is not the one its job carries is never put in place, and the
driver checks what it received against the digest the task's result carries (transfer.py), so bytes
changed on the wire are refused before anything unpickles or loads them.
"""

import contextlib
import json
import os
import queue
import secrets
import socketserver
import ssl
import sys
import threading
import time

from tfbarrier import settings
from tfbarrier.tls import describe
from tfbarrier.spark import link_wire
from tfbarrier.waiting_room import LIMIT, WaitingRoom


class _Handler(socketserver.StreamRequestHandler):
    def setup(self):
        self.accepted = self.request  # the plain socket, in the waiting room until it proved the token
        self.request.settimeout(settings.CONNECT_TIMEOUT)  # for the TLS handshake and the hello: a stranger's
        tls = self.server.owner.tls                        # silence ends here
        if tls is not None:  # the handshake runs here, in the connection's thread: a stranger holds up no other
            self.request = tls.server(self.request)
        super().setup()

    def handle(self):
        server = self.server.owner
        try:
            hello = self._proved_hello(server)
        finally:
            server.room.leave(self.accepted)
        if hello is None:
            server.room.turn_away(self.client_address[0])
            return  # closing the connection is the answer
        if "fetch" in hello or "put" in hello:
            self.request.settimeout(settings.TRANSFER_IDLE_TIMEOUT)
        if "fetch" in hello:
            self._send_file(server.files, hello["fetch"])
        elif "put" in hello:
            self._receive_file(server.files, hello["put"], hello.get("size"))
        elif isinstance(hello.get("request"), dict):
            self.request.settimeout(None)
            self._answer_request(server, hello["request"])
        else:
            self.request.settimeout(None)  # a task's messages: as long as it runs
            self._messages(server)

    def _proved_hello(self, server):
        """The connection's hello once it proved the token (the server's nonce, then one line); None otherwise."""
        nonce = secrets.token_bytes(link_wire.NONCE_BYTES)
        self.wfile.write(json.dumps({"nonce": nonce.hex()}).encode() + b"\n")
        line = self.rfile.readline(link_wire.HELLO_LIMIT)
        try:
            hello = json.loads(line) if line.endswith(b"\n") else None
        except ValueError:
            hello = None
        if not isinstance(hello, dict):
            return None
        proof = str(hello.pop("proof", ""))
        return hello if secrets.compare_digest(proof, link_wire.proof(server.token, nonce, hello)) else None

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
        if path is None or not isinstance(size, int) or size < 0:
            self._reply({"error": f"the driver takes no file {name!r}"})
            return
        files.took(name, link_wire.copy_into(self.rfile, path, size))
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
    request_queue_size = LIMIT

    def verify_request(self, request, client_address):
        """In the accepting thread: a connection starts a thread only while the waiting room has room for it."""
        return self.owner.room.enter(request, client_address[0])

    def process_request(self, request, client_address):
        try:
            super().process_request(request, client_address)
        except RuntimeError:  # no thread to be had: this connection is closed, the server goes on
            self.owner.room.leave(request)
            self.owner.room.turn_away(client_address[0])
            self.shutdown_request(request)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:  # a failed TLS handshake never reached the handler's own account
            self.owner.room.leave(request)

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ssl.SSLError, ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)  # the driver's own trouble (a full disk...): printed
        self.owner.room.turn_away(client_address[0])  # a failed TLS handshake, a silent stranger, a task gone mid-message


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
        self.room = WaitingRoom()  # connections yet to prove the token; who was turned away, by address
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

    @property
    def strangers(self):
        """Address -> connections refused: no proof, or no room to wait."""
        return self.room.turned_away

    @property
    def rejected(self):
        """How many connections were refused."""
        return sum(self.strangers.values())

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
            self._sock, answers = link_wire.open_proved(endpoint)
            answers.close()  # the driver answers nothing on this connection
            self._sock.settimeout(None)
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

    def fetch(self, name, path, sha256):
        """Stream the driver's file ``name`` (whose SHA-256 is ``sha256``) into ``path``; its size. Raises
        OSError when it cannot."""
        return fetch(self._endpoint, name, path, sha256)

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
    sock, answers = link_wire.open_proved(endpoint, **hello)
    with sock, answers:
        sock.settimeout(settings.TRANSFER_IDLE_TIMEOUT)
        yield sock, answers


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


def fetch(endpoint, name, path, sha256):
    """Stream the file ``name`` offered by the DriverServer at ``endpoint`` into ``path``, written aside
    and renamed into place once whole and its SHA-256 ``sha256``; its size. Raises OSError (ConnectionError,
    link_wire.DigestMismatch...) when it cannot."""
    with _file_connection(endpoint, fetch=name) as (sock, answers):
        size = _answer(answers, name)["size"]
        link_wire.copy_into(answers, path, size, sha256)
    return size


