"""A ring all-reduce between a job's training processes that admits only the job's own peers.

The first step of docs/gradient-exchange-design.md: not wired into fit yet. Each process listens on a
port of its own and connects to the next in the ring; a connection is kept only after both sides proved
that they hold the job's secret (HMAC-SHA256 over both sides' nonces, so nothing a stranger sends is read
as data and a recorded exchange cannot be replayed). ``Ring.all_reduce_sum`` sums equal-shaped numpy
arrays across the ring: reduce-scatter, then all-gather, each process sending 2 (n - 1) / n of the
array's bytes. A failure is a WorkerError, retryable when a peer is missing or went silent, not when a
peer cannot prove that it belongs to the job.
"""

import hashlib
import hmac
import queue
import secrets
import socket
import struct
import threading
import time

import numpy as np

from .errors import WorkerError

NONCE_BYTES = 32
LOST_PEER = "lost in the ring: "  # begins the message of every failure for want of a peer
_HELLO = struct.Struct("!I")  # the connecting process's rank
_STEP = struct.Struct("!Q")  # each chunk's sequence number: a peer out of step is found, not summed


def _proof(secret, label, *parts):
    return hmac.new(secret, label + b"".join(parts), hashlib.sha256).digest()


def _recv_exactly(sock, size):
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("the peer closed the connection")
        got += n
    return data


def _admit(conn, secret, expected_rank):
    """The accepting side: the peer proves the secret first, then this side does."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    conn.sendall(nonce)
    hello = _recv_exactly(conn, _HELLO.size + NONCE_BYTES + 32)
    rank, their_nonce, proof = _HELLO.unpack(hello[:4])[0], hello[4:4 + NONCE_BYTES], hello[4 + NONCE_BYTES:]
    if rank != expected_rank or not hmac.compare_digest(
            proof, _proof(secret, b"tfbarrier-ring-hello", nonce, their_nonce, hello[:4])):
        return False
    conn.sendall(_proof(secret, b"tfbarrier-ring-welcome", their_nonce, nonce))
    return True


def _introduce(sock, secret, rank):
    """The connecting side: prove the secret, then check the peer's proof."""
    their_nonce = _recv_exactly(sock, NONCE_BYTES)
    nonce, hello = secrets.token_bytes(NONCE_BYTES), _HELLO.pack(rank)
    sock.sendall(hello + nonce + _proof(secret, b"tfbarrier-ring-hello", their_nonce, nonce, hello))
    welcome = _recv_exactly(sock, 32)
    return hmac.compare_digest(welcome, _proof(secret, b"tfbarrier-ring-welcome", nonce, their_nonce))


class Ring:
    """This process's place in the ring: ``rank`` of ``len(addresses)``, connected to its neighbours."""

    def __init__(self, rank, size, left, right, timeout):
        self.rank, self.size, self.timeout = rank, size, timeout
        self._left, self._right, self._step = left, right, 0
        self._sends, self._sent = queue.Queue(), queue.Queue()
        self._sender = threading.Thread(target=self._send_loop, name="tfbarrier-ring-send", daemon=True)
        if size > 1:
            self._sender.start()

    @classmethod
    def join(cls, rank, addresses, secret, listener, timeout=60.0):
        """Connect to the next process in ``addresses`` (``host:port`` of every rank) and admit the
        previous one on ``listener`` (a listening socket on this rank's address). Connections that do not
        prove ``secret`` (bytes) are closed and the wait goes on; WorkerError after ``timeout`` s."""
        size = len(addresses)
        if size == 1:
            return cls(rank, 1, None, None, timeout)
        deadline = time.monotonic() + timeout
        accepted = {}
        acceptor = threading.Thread(target=cls._accept, args=(listener, secret, (rank - 1) % size, deadline, accepted),
                                    daemon=True)
        acceptor.start()
        try:
            right = cls._connect(addresses[(rank + 1) % size], secret, rank, deadline)
        except WorkerError:
            acceptor.join(0.1)
            if accepted.get("conn") is not None:  # the previous worker got in meanwhile: not left open
                accepted["conn"].close()
            raise
        acceptor.join(max(0.0, deadline - time.monotonic()))
        left = accepted.get("conn")
        if left is None:
            right.close()
            raise WorkerError(f"worker {(rank - 1) % size} did not join the ring within {timeout:g} s "
                              f"({accepted.get('refused', 0)} connection(s) without the job's secret refused)",
                              worker=(rank - 1) % size, retryable=True)
        for sock in (left, right):
            sock.settimeout(timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(rank, size, left, right, timeout)

    @staticmethod
    def _accept(listener, secret, expected_rank, deadline, accepted):
        while time.monotonic() < deadline:
            listener.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn, _ = listener.accept()
            except OSError:  # the deadline passed (a timeout is an OSError), or the listener closed
                return
            conn.settimeout(max(0.01, min(5.0, deadline - time.monotonic())))
            try:
                if _admit(conn, secret, expected_rank):
                    accepted["conn"] = conn
                    return
            except OSError:  # the stranger closed or went quiet
                pass
            accepted["refused"] = accepted.get("refused", 0) + 1
            conn.close()

    @staticmethod
    def _connect(address, secret, rank, deadline):
        host, port = address.rsplit(":", 1)
        last = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection((host, int(port)), timeout=max(0.01, deadline - time.monotonic()))
            except OSError as exc:  # not listening yet
                last = exc
                time.sleep(0.05)
                continue
            try:
                if _introduce(sock, secret, rank):
                    return sock
                why = "did not prove that it holds this job's secret"
            except OSError as exc:  # the peer closed: it did not accept this process's proof
                why = f"refused this process's proof of the job's secret ({exc})"
            sock.close()
            raise WorkerError(f"the next worker in the ring, at {address}, {why}: are both of this job?")
        raise WorkerError(f"could not reach the next worker in the ring at {address} within the ring's timeout: {last}",
                          retryable=True)

    def _send_loop(self):
        while (parts := self._sends.get()) is not None:
            try:
                for part in parts:
                    self._right.sendall(part)
                self._sent.put(None)
            except OSError as exc:
                self._sent.put(exc)

    def _exchange(self, outgoing, incoming):
        """Send ``outgoing`` to the right while reading ``incoming``'s size from the left."""
        self._step += 1
        # ``outgoing`` is sent as it lies: no step changes it before this one's send is done
        self._sends.put((_STEP.pack(self._step), memoryview(np.ascontiguousarray(outgoing)).cast("B")))
        try:
            step = _STEP.unpack(_recv_exactly(self._left, _STEP.size))[0]
            data = _recv_exactly(self._left, incoming.nbytes)
        except OSError as exc:  # a timeout, a closed or reset connection
            raise self._lost(self.rank - 1, f"went silent in the ring ({exc})") from None
        if step != self._step:
            raise WorkerError(f"worker {(self.rank - 1) % self.size} is out of step in the ring ({step}, not {self._step})")
        try:
            sent = self._sent.get(timeout=self.timeout)
        except queue.Empty:
            sent = f"nothing read for {self.timeout:g} s"
        if sent is not None:
            raise self._lost(self.rank + 1, f"stopped reading the ring ({sent})")
        return np.frombuffer(data, dtype=incoming.dtype)

    def _lost(self, rank, what):
        worker = rank % self.size
        return WorkerError(f"{LOST_PEER}worker {worker} {what}", worker=worker, retryable=True)

    def all_reduce_sum(self, array):
        """The sum of every process's ``array`` (same shape and dtype everywhere), on every process."""
        total = np.array(array, copy=True)
        if self.size == 1:
            return total
        flat = total.reshape(-1)
        chunks = np.array_split(flat, self.size)
        for step in range(self.size - 1):  # reduce-scatter: chunk (rank + 1) ends whole here
            send, receive = (self.rank - step) % self.size, (self.rank - step - 1) % self.size
            chunks[receive] += self._exchange(chunks[send], chunks[receive])
        for step in range(self.size - 1):  # all-gather
            send, receive = (self.rank - step + 1) % self.size, (self.rank - step) % self.size
            chunks[receive][:] = self._exchange(chunks[send], chunks[receive])
        return total

    def all_gather(self, array):
        """Every process's ``array`` (same shape and dtype everywhere) stacked in rank order, on every process:
        the sum of stacks that are zeros but for each process's own row."""
        stacked = np.zeros((self.size, *np.shape(array)), np.asarray(array).dtype)
        stacked[self.rank] = array
        return self.all_reduce_sum(stacked)

    def close(self):
        if self.size > 1:
            self._sends.put(None)
            for sock in (self._left, self._right):
                sock.close()
