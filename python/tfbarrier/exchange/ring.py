"""A ring all-reduce between a job's training processes that admits only the job's own peers.

How the workers of a fit over tfbarrier's ring exchange gradients and metric states (ring_side.py;
docs/internals/gradient-exchange-design.md).
Each process listens on a port of its own and connects to the next in the ring; a connection is kept only
after both sides proved that they hold the job's secret (ring_admission.py, which also keeps strangers'
connections from stretching or stopping the wait), over TLS with the job's credentials (tls.py: the cluster
encrypts).
``Ring.all_reduce_sum`` sums equal-shaped numpy arrays across the ring: reduce-scatter, then all-gather, each
process sending 2 (n - 1) / n of the array's bytes. A failure is a WorkerError, retryable when a peer is
missing, not when a peer cannot prove that it belongs to the job; a peer lost once the ring is made is a
PeerLostError, which the ring also keeps (``failure``): raised inside a compiled step, TensorFlow hands the
caller its own error for it.
"""

import math
import queue
import socket
import struct
import threading
import time
import zlib

import numpy as np

from tfbarrier.errors import PeerLostError, WorkerError
from tfbarrier.exchange import ring_admission
from tfbarrier.tls import describe

_STEP = struct.Struct("!Q")  # each chunk's sequence number: a peer out of step is found, not summed
# what arrives to be summed lands in a scratch of this much at most, added segment by segment: a scratch of one
# chunk of a large gradient's would be held by the ring for its life
SEGMENT_BYTES = 8 * 2**20
DEAD_LINK_SECONDS = 10  # a link that answers nothing for this long fails the ring (_fail_on_dead_links)


def _aggregation(variable):
    """How a variable aggregates across replicas: "sum", "mean"...: Keras 3's name, or tf.VariableAggregation's."""
    aggregation = getattr(variable, "aggregation", "sum")
    return str(getattr(aggregation, "name", aggregation)).lower()


def _checksum(variable):
    """The CRC-32 of a variable's bytes, read a block of rows of at most SEGMENT_BYTES at a time (rows of its widest
    float's values: the block's size told by the shape alone, a small variable read in one): no copy of a large
    variable (a frozen embedding, a cut kernel) is made whole."""
    shape = [int(d) for d in variable.shape]
    if not shape:
        return zlib.crc32(np.ascontiguousarray(variable.numpy()).view(np.uint8))
    rows = rows_per_segment(shape)
    crc = 0
    for start in range(0, shape[0], rows):
        crc = zlib.crc32(np.ascontiguousarray(variable[start:start + rows].numpy()).view(np.uint8), crc)
    return crc


def rows_per_segment(shape):
    """Rows of the first dimension of a weight of ``shape`` in a segment of at most SEGMENT_BYTES (rows of its
    widest float's values: told by the shape alone)."""
    return max(1, SEGMENT_BYTES // (8 * max(1, math.prod(shape[1:]))))


def _fail_on_dead_links(sock):
    """Make a dead link (a host cut off or stopped) fail ``sock`` within about DEAD_LINK_SECONDS, where a
    peer that is only busy (tracing, saving, validating) keeps it alive: its kernel still answers. TCP
    keepalive probes find it on the socket a worker waits to read from (no TCP_USER_TIMEOUT: it would also
    end a connection to a live peer whose receive window stays full while it is busy)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    probes = {"TCP_KEEPIDLE": DEAD_LINK_SECONDS // 3, "TCP_KEEPINTVL": DEAD_LINK_SECONDS // 6, "TCP_KEEPCNT": 4}
    for name, value in probes.items():
        if hasattr(socket, name):  # Linux's; elsewhere the ring's own timeout remains
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class Ring:
    """This process's place in the ring: ``rank`` of ``len(addresses)``, connected to its neighbours."""

    def __init__(self, rank, size, left, right, timeout):
        self.rank, self.size, self.timeout = rank, size, timeout
        self._left, self._right, self._step = left, right, 0
        self._scratch = np.empty(0, np.uint8)  # where a reduce-scatter's incoming chunk lands, reused
        self.bytes_sent = 0  # to the right, over the ring's life: what a worker reports of its traffic
        self.failure = None  # the PeerLostError this ring raised, if it did
        self._sends, self._sent = queue.Queue(), queue.Queue()
        self._sender = threading.Thread(target=self._send_loop, name="tfbarrier-ring-send", daemon=True)
        if size > 1:
            self._sender.start()

    @classmethod
    def join(cls, rank, addresses, secret, listener, timeout=60.0, tls=None):
        """Connect to the next process in ``addresses`` (``host:port`` of every rank) and admit the
        previous one on ``listener`` (a listening socket on this rank's address), over TLS with ``tls``
        (tls.Credentials). Connections that do not prove ``secret`` (bytes) are closed and the wait
        goes on; WorkerError after ``timeout`` s."""
        size = len(addresses)
        if size == 1:
            return cls(rank, 1, None, None, timeout)
        deadline, previous = time.monotonic() + timeout, (rank - 1) % size
        admission = ring_admission.Admission(listener, (secret, tls), previous, deadline,
                                             ring_admission.addresses_of(addresses[previous]))
        try:
            right = cls._connect(addresses[(rank + 1) % size], (secret, tls), rank, deadline)
        except WorkerError:
            admission.abandon()  # the previous worker may have got in meanwhile: not left open
            raise
        left = admission.wait(max(0.0, deadline - time.monotonic()))
        if left is None:
            admission.abandon()
            right.close()
            raise ring_admission.not_joined(admission, previous, rank, addresses, timeout)
        try:
            for sock in (left, right):
                sock.settimeout(timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _fail_on_dead_links(sock)
        except OSError as exc:  # a neighbour gone in the meantime: neither connection left open
            left.close()
            right.close()
            raise WorkerError(f"the ring's connections failed as they were made ({exc})", retryable=True) from None
        return cls(rank, size, left, right, timeout)

    @staticmethod
    def _connect(address, credentials, rank, deadline):
        """A connection to ``address`` (the next rank) that proved the secret both ways; WorkerError by
        ``deadline``, or at once when the process there proves to be no peer of this job."""
        host, port = address.rsplit(":", 1)
        last = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection((host, int(port)), timeout=max(0.01, deadline - time.monotonic()))
            except OSError as exc:  # not listening yet
                last = exc
                time.sleep(0.05)
                continue
            sock, why = ring_admission.greet(sock, credentials, rank)
            if why is None:
                return sock
            sock.close()
            if why is ring_admission.RETRY:
                last = "the TLS handshake failed"
                time.sleep(0.05)
                continue
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

    def _exchange(self, outgoing, into, add=False):
        """Send ``outgoing`` to the right while reading ``into`` (a contiguous array, filled in place) from the left,
        or, with ``add``, adding what arrives into it, a segment at a time as it lands in the scratch."""
        self._step += 1
        # ``outgoing`` is sent as it lies: no step changes it before this one's send is done
        payload = memoryview(np.ascontiguousarray(outgoing).reshape(-1).view(np.uint8))  # bfloat16 has no buffer format
        self._sends.put((_STEP.pack(self._step), payload))
        self.bytes_sent += _STEP.size + payload.nbytes
        try:
            step = _STEP.unpack(ring_admission.recv_exactly(self._left, _STEP.size))[0]
            if step != self._step:
                raise WorkerError(f"worker {(self.rank - 1) % self.size} is out of step in the ring ({step}, not "
                                  f"{self._step})")
            into = into.reshape(-1)  # contiguous: a view, not a copy
            if add:
                self._receive_adding(into)
            else:
                ring_admission.recv_into(self._left, memoryview(into.view(np.uint8)))
        except OSError as exc:  # a timeout, a closed or reset connection
            raise self._lost(self.rank - 1, f"went silent in the ring ({exc})") from None
        try:
            sent = self._sent.get(timeout=self.timeout)
        except queue.Empty:
            sent = f"nothing read for {self.timeout:g} s"
        if sent is not None:
            raise self._lost(self.rank + 1, f"stopped reading the ring ({sent})")

    def _receive_adding(self, into):
        """What the left sends, added into ``into`` (1-D) a segment of SEGMENT_BYTES at a time."""
        length = max(1, SEGMENT_BYTES // into.itemsize)
        for start in range(0, into.size, length):
            segment = into[start:start + length]
            incoming = self._incoming(segment)
            ring_admission.recv_into(self._left, memoryview(incoming.view(np.uint8)))
            segment += incoming

    def _incoming(self, like):
        """A scratch array shaped and typed as ``like`` for a segment to land in (the same memory each time)."""
        if self._scratch.nbytes < like.nbytes:
            self._scratch = np.empty(like.nbytes, np.uint8)
        return self._scratch[:like.nbytes].view(like.dtype).reshape(like.shape)

    def _summed_around(self, chunks, whole):
        """A reduce-scatter of ``chunks`` (views, one per rank, the same sizes everywhere) in place: n - 1 steps,
        each sending a chunk to the right and adding the left's into the next, after which chunk ``whole`` holds
        every process's sum here."""
        for step in range(self.size - 1):
            send, receive = (whole - step - 1) % self.size, (whole - step - 2) % self.size
            self._exchange(chunks[send], into=chunks[receive], add=True)

    def _gathered_around(self, chunks, whole):
        """An all-gather of ``chunks`` in place, chunk ``whole`` being this process's complete one: n - 1 steps,
        each passing the chunk last completed to the right."""
        for step in range(self.size - 1):
            send, receive = (whole - step) % self.size, (whole - step - 1) % self.size
            self._exchange(chunks[send], into=chunks[receive])

    @property
    def encryption(self):
        """The TLS version and cipher of this process's ring connections, or None: plain TCP."""
        return describe(self._right)

    def _lost(self, rank, what):
        worker = rank % self.size
        self.failure = PeerLostError(f"lost in the ring: worker {worker} {what}", worker=worker,
                                     exc_type="PeerLostError")
        return self.failure

    def all_reduce_sum(self, array, in_place=False):
        """The sum of every process's ``array`` (same shape and dtype everywhere), on every process: a new
        array, or, ``in_place``, ``array`` itself summed into (unless it is not a writable contiguous one)."""
        total = np.require(array, requirements=("C", "W")) if in_place else np.array(array, copy=True)
        if self.size == 1:
            return total
        chunks = np.array_split(total.reshape(-1), self.size)
        self._summed_around(chunks, whole=(self.rank + 1) % self.size)
        self._gathered_around(chunks, whole=(self.rank + 1) % self.size)
        return total

    def reduce_scatter(self, flat, sizes, view=False):
        """This process's chunk of the sum of every process's ``flat`` (a 1-D array, the same length and dtype
        everywhere), cut into chunks of ``sizes`` (one per rank, in rank order; any may be 0): chunk ``rank``,
        summed into ``flat`` where it is writable: ``flat`` itself where the chunk is all of it, else a copy of the
        chunk alone, so that the rest is freed, or with ``view`` the chunk where it lies in ``flat`` (which it then
        keeps: for a chunk that is most of what a process holds of ``flat`` until it is used). The first half of
        ``all_reduce_sum``, with the chunk each process ends with chosen."""
        chunks = np.split(np.require(flat, requirements=("C", "W")).reshape(-1), np.cumsum(sizes)[:-1])
        self._summed_around(chunks, whole=self.rank)
        mine = chunks[self.rank]
        return mine if view or mine.size == flat.size else mine.copy()

    def all_gather_chunks(self, mine, sizes):
        """The other processes' chunks (each process's of ``sizes[rank]`` values; ``mine`` is this one's),
        joined in rank order, on every process: the second half of ``all_reduce_sum``. This process's own is
        sent as it lies and not returned (a process that holds all of it gets an empty array)."""
        mine = np.asarray(mine)
        others = np.empty(int(np.sum(sizes)) - sizes[self.rank], mine.dtype)
        bounds = np.cumsum([0] + [size for rank, size in enumerate(sizes) if rank != self.rank])
        chunks = [mine if rank == self.rank else others[bounds[rank - (rank > self.rank)]:
                                                        bounds[rank - (rank > self.rank) + 1]]
                  for rank in range(self.size)]  # views into ``others``
        self._gathered_around(chunks, whole=self.rank)
        return others

    def all_gather_into(self, flat, sizes):
        """Every process's chunk of ``flat`` (a writable 1-D array, the same length everywhere, cut into chunks of
        ``sizes`` in rank order, this process's own already in it) written where it lies, on every process: no
        buffer but ``flat`` (a cut variable's own rows, sharded_update.py)."""
        self._gathered_around(np.split(flat, np.cumsum(sizes)[:-1]), whole=self.rank)

    def all_gather(self, array):
        """Every process's ``array`` (same shape and dtype everywhere) stacked in rank order, on every process:
        each row travels the ring once, right to left, n - 1 hops (n - 1 arrays sent per process)."""
        array = np.asarray(array)
        stacked = np.empty((self.size, *array.shape), array.dtype)
        stacked[self.rank] = array
        for step in range(self.size - 1):
            send, receive = (self.rank - step) % self.size, (self.rank - step - 1) % self.size
            self._exchange(stacked[send:send + 1], into=stacked[receive:receive + 1])  # views, scalars too
        return stacked

    def broadcast_variables(self, variables):
        """Give every process rank 0's values of ``variables``: each summed with zeros from the others (exact)."""
        if self.size == 1:
            return
        for variable in variables:
            value = variable.numpy()
            variable.assign(self.all_reduce_sum(value if self.rank == 0 else np.zeros_like(value)))

    def sum_variables(self, variables, mean=False):
        """Replace each Keras variable (Keras 3's or TensorFlow's) that aggregates by sum (every metric's state)
        by its sum across the ring, one that aggregates by mean (or every one, with ``mean``) by its mean: one
        exchange for them all, in the order given (the same on every process)."""
        if not mean:
            variables = [v for v in variables if _aggregation(v) in ("sum", "mean")]
        if self.size == 1 or not variables:
            return
        values = [v.numpy() for v in variables]
        total = self.all_reduce_sum(np.concatenate([np.asarray(value, np.float64).reshape(-1) for value in values]))
        at = 0
        for variable, value in zip(variables, values):
            summed = total[at:at + value.size].reshape(value.shape)
            at += value.size
            if mean or _aggregation(variable) == "mean":
                summed = summed / self.size
            variable.assign(summed.astype(value.dtype))

    def differing(self, variables):
        """Those of ``variables`` whose values are not the same on every process: only a checksum of each
        crosses the ring (a frozen backbone's weights, the same everywhere, never do)."""
        if self.size == 1 or not variables:
            return []
        checksums = np.array([_checksum(v) for v in variables], np.int64)
        everyones = self.all_gather(checksums)
        return [v for v, column in zip(variables, everyones.T) if (column != column[0]).any()]

    def close(self):
        if self.size > 1:
            self._sends.put(None)
            for sock in (self._left, self._right):
                sock.close()
