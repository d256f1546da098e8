"""Who gets into the ring (ring.py): the proofs its processes make to each other, and the accepting side's wait
for the previous rank, which strangers cannot stretch or stop.

A connection is kept only after both sides proved that they hold the job's secret (HMAC-SHA256 over both sides'
nonces, so nothing a stranger sends is read as data and a recorded exchange cannot be replayed). With the job's TLS
credentials (tls.py) each connection is TLS first and the proofs go inside it. A stranger's connection is tried for
at most PROOF_SECONDS, and only as many at once as a waiting room takes (waiting_room.py); more are closed as
they come. A flood that keeps the previous rank out fails the join within FLOOD_SECONDS, naming it.
"""

import errno
import hashlib
import hmac
import secrets
import socket
import ssl
import struct
import threading
import time

from tfbarrier.errors import WorkerError
from tfbarrier.waiting_room import WaitingRoom

NONCE_BYTES = 32
PROOF_SECONDS = 5.0  # for a connection to prove the secret (the job's peer does at once)
# A flood that kept the previous rank's own address (or every address) from trying this long fails the join,
# naming it, instead of waiting out the ring's timeout.
FLOOD_SECONDS = 20.0
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_HELLO = struct.Struct("!I")  # the connecting process's rank
RETRY = "retry"  # _greet: connect again until the deadline


def _proof(secret, label, *parts):
    return hmac.new(secret, label + b"".join(parts), hashlib.sha256).digest()


def recv_exactly(sock, size):
    data = bytearray(size)
    recv_into(sock, memoryview(data))
    return data


def recv_into(sock, view):
    """Fill ``view`` (a writable byte view) from ``sock``."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("the peer closed the connection")
        got += n


def _admit(conn, secret, expected_rank):
    """The accepting side: the peer proves the secret first, then this side does."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    conn.sendall(nonce)
    hello = recv_exactly(conn, _HELLO.size + NONCE_BYTES + 32)
    rank, their_nonce, proof = _HELLO.unpack(hello[:4])[0], hello[4:4 + NONCE_BYTES], hello[4 + NONCE_BYTES:]
    if rank != expected_rank or not hmac.compare_digest(
            proof, _proof(secret, b"tfbarrier-ring-hello", nonce, their_nonce, hello[:4])):
        return False
    conn.sendall(_proof(secret, b"tfbarrier-ring-welcome", their_nonce, nonce))
    return True


def _introduce(sock, secret, rank, their_nonce):
    """The connecting side, the accepting side's nonce read: prove the secret, then check the peer's proof."""
    nonce, hello = secrets.token_bytes(NONCE_BYTES), _HELLO.pack(rank)
    sock.sendall(hello + nonce + _proof(secret, b"tfbarrier-ring-hello", their_nonce, nonce, hello))
    welcome = recv_exactly(sock, 32)
    return hmac.compare_digest(welcome, _proof(secret, b"tfbarrier-ring-welcome", nonce, their_nonce))


def greet(sock, credentials, rank):
    """The connecting side's TLS (with ``credentials``' tls.Credentials) and proof of the secret:
    (the socket, None), (it, why the peer is not this job's), or (it, RETRY) when the TLS handshake failed
    otherwise (the peer went away, or it is not speaking TLS: not yet the job's process there)."""
    secret, tls = credentials
    try:
        if tls is not None:
            sock = tls.client(sock)
        their_nonce = recv_exactly(sock, NONCE_BYTES)
    except ssl.SSLCertVerificationError as exc:
        return sock, f"did not present the job's certificate ({exc.verify_message})"
    except OSError:  # closed before its nonce: not yet the job's process there, or no room for one more try
        return sock, RETRY
    try:
        if _introduce(sock, secret, rank, their_nonce):
            return sock, None
        return sock, "did not prove that it holds this job's secret"
    except OSError as exc:  # the peer closed: it did not accept this process's proof
        return sock, f"refused this process's proof of the job's secret ({exc})"


class Admission:
    """The accepting side's wait for the previous rank on ``listener``: each connection is tried in a thread
    of its own, so a stranger that holds one open (or stalls its TLS handshake) delays nobody; the first to
    prove the secret is kept, every other connection closed. Only as many are tried at once as a waiting room
    takes: more are closed as they come (``room.turned_away`` counts them, and the unproved, by address).
    ``flooded_for``: how long connections from ``peer_addresses`` (or from anywhere: the room full) have been
    turned away without a pause of PROOF_SECONDS."""

    def __init__(self, listener, credentials, expected_rank, deadline, peer_addresses=()):
        self.room, self._conn, self._abandoned = WaitingRoom(), None, False
        self._flood, self._peer_addresses = None, set(peer_addresses)  # (first, last) turned away of a streak
        self._lock, self._admitted = threading.Lock(), threading.Event()
        self._listener, self._credentials, self._rank, self._deadline = listener, credentials, expected_rank, deadline
        threading.Thread(target=self._accept, name="tfbarrier-ring-accept", daemon=True).start()

    def _accept(self):
        while not self._admitted.is_set() and time.monotonic() < self._deadline:
            try:  # the listener may close (the ring made) at any moment
                self._listener.settimeout(min(0.2, max(0.01, self._deadline - time.monotonic())))
                conn, address = self._listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:  # the process is out of descriptors for now: not for good
                    time.sleep(0.05)
                    continue
                return  # the listener closed
            if not self.room.enter(conn, address[0]):
                self._turned_away(address[0])
                conn.close()
                continue
            try:
                threading.Thread(target=self._try, args=(conn, address[0]), name="tfbarrier-ring-admit",
                                 daemon=True).start()
            except RuntimeError:  # no thread to be had
                self.room.leave(conn)
                self.room.turn_away(address[0])
                conn.close()

    def _turned_away(self, source):
        """A connection from ``source`` found no room: a flood's, which the streak counts when it may be keeping
        the previous rank out."""
        if source in self._peer_addresses or self.room.full():
            with self._lock:
                now = time.monotonic()
                first = self._flood[0] if self._flood and now - self._flood[1] <= PROOF_SECONDS else now
                self._flood = (first, now)

    def _try(self, accepted, source):
        secret, tls = self._credentials
        accepted.settimeout(max(0.01, min(PROOF_SECONDS, self._deadline - time.monotonic())))
        conn = accepted
        try:
            if tls is not None:
                conn = tls.server(accepted)  # a stranger speaking plain TCP fails here
            admitted = _admit(conn, secret, self._rank)
        except OSError:  # the stranger closed or went quiet
            admitted = False
        self.room.leave(accepted)
        if not admitted:
            self.room.turn_away(source)
        with self._lock:
            if admitted and self._conn is None and not self._abandoned:
                self._conn = conn
                self._admitted.set()
                return
        conn.close()

    def wait(self, seconds):
        """The admitted connection, or None after ``seconds``, or as soon as a flood has kept the previous rank
        out for FLOOD_SECONDS."""
        deadline = time.monotonic() + seconds
        while not self._admitted.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or self.flooded_for() >= FLOOD_SECONDS:
                break
        with self._lock:
            return self._conn

    def flooded_for(self):
        flood, now = self._flood, time.monotonic()
        return 0.0 if flood is None or now - flood[1] > PROOF_SECONDS else now - flood[0]

    def abandon(self):
        """Stop waiting; close what got in meanwhile."""
        with self._lock:
            self._abandoned, conn, self._conn = True, self._conn, None
        self._admitted.set()
        if conn is not None:
            conn.close()


def addresses_of(address):
    """The IP addresses a rank at ``address`` ("host:port") connects from, as far as its host's name says."""
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return {host}


def not_joined(admission, previous, rank, addresses, timeout):
    """Why the previous rank is not in the ring: a flood that kept it out (not retried: a new attempt would
    meet the same), or it did not come in time."""
    if admission.flooded_for() >= FLOOD_SECONDS:
        return WorkerError(
            f"worker {rank}'s ring port ({addresses[rank]}) was flooded: connections that never proved the job's "
            f"secret ({admission.room.describe()}) kept worker {previous} ({addresses[previous]}) from getting in "
            f"for {FLOOD_SECONDS:g} s. Find what connects from there; on a network others reach, keep the executors' "
            "ports behind a firewall", worker=rank, retryable=False)
    refused = admission.room.describe()
    return WorkerError(f"worker {previous} did not join the ring within {timeout:g} s"
                       + (f" (connections without the job's secret refused: {refused})" if refused else ""),
                       worker=previous, retryable=True)
