"""exchange/ring.py's ring: the sums (2 to 16 ranks), and who gets in. Each rank runs in a thread of this process with a real
listening socket on 127.0.0.1 (no TensorFlow, no Spark)."""

import socket
import ssl
import threading
import time

import ml_dtypes
import numpy as np
import pytest

from tfbarrier.errors import WorkerError
from tfbarrier.exchange import ring as ring_module
from tfbarrier.exchange.ring import Ring
from tfbarrier.exchange.ring_admission import NONCE_BYTES
from tfbarrier.tls import Credentials

SECRET = b"the job's secret"


def listeners(n):
    socks = []
    for _ in range(n):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        socks.append(sock)
    return socks, [f"127.0.0.1:{sock.getsockname()[1]}" for sock in socks]


def in_threads(n, work, secrets=None, timeout=10.0, tls=None, ring_class=Ring):
    """Run ``work(ring)`` on every rank of an ``n``-process ring (rank i holding ``secrets[i]`` and TLS
    credentials ``tls[i]``): each rank's result, or the exception it raised."""
    socks, addresses = listeners(n)
    results = [None] * n

    def rank(i):
        try:
            ring = ring_class.join(i, addresses, (secrets or [SECRET] * n)[i], socks[i], timeout=timeout,
                                   tls=(tls or [None] * n)[i])
            try:
                results[i] = work(ring)
            finally:
                ring.close()
        except Exception as exc:  # noqa: B902 - the test looks at it
            results[i] = exc

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for sock in socks:
        sock.close()
    return results


def two_ranks_sum(socks, addresses, tls=None, timeout=10):
    """Ranks 0 and 1 join on ``socks`` and sum [1.0] and [2.0]: each rank's sum, as a list."""
    results = [None, None]

    def rank(i):
        ring = Ring.join(i, addresses, SECRET, socks[i], timeout=timeout, tls=tls)
        results[i] = ring.all_reduce_sum(np.array([i + 1.0])).tolist()
        ring.close()

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.mark.parametrize("n, length, dtype", [(1, 5, "int64"), (2, 7, "int64"), (3, 2, "int64"), (4, 1001, "int64"),
                                              (3, 50, "float32"), (8, 4099, "int64"), (16, 4099, "int64"),
                                              (16, 9, "int64")])
def test_the_ring_sums_every_ranks_array_on_every_rank(n, length, dtype):
    # arrays shorter than the ring leave some chunks empty; lengths not divisible by n make them uneven
    arrays = [np.random.default_rng(i).integers(-1000, 1000, size=(length,)).astype(dtype) for i in range(n)]
    results = in_threads(n, lambda ring: [ring.all_reduce_sum(arrays[ring.rank] * k) for k in (1, 2)])
    expected = np.sum(arrays, axis=0)
    for i, result in enumerate(results):
        assert not isinstance(result, Exception), result
        np.testing.assert_array_equal(result[0], expected)
        np.testing.assert_array_equal(result[1], 2 * expected)  # a second reduce on the same connections
        assert result[0].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(arrays[i], np.random.default_rng(i).integers(-1000, 1000, size=(length,)))


@pytest.mark.parametrize("n", [1, 3])
def test_the_ring_sums_in_place_into_a_writable_array_and_copies_a_read_only_one(n):
    # in place: a gradient pack's buffer (ring_hooks) summed where it lies, no copy of the pack made
    arrays = [np.arange(10, dtype="float32") * (i + 1) for i in range(n)]
    expected, frozen = np.sum(arrays, axis=0), [array.copy() for array in arrays]
    for array in frozen:
        array.flags.writeable = False

    def work(ring):
        own = ring.all_reduce_sum(arrays[ring.rank], in_place=True)
        return own, ring.all_reduce_sum(frozen[ring.rank], in_place=True)

    results = in_threads(n, work)
    for i, result in enumerate(results):
        assert not isinstance(result, Exception), result
        own, copied = result
        assert own is arrays[i]
        np.testing.assert_array_equal(own, expected)
        assert copied is not frozen[i]
        np.testing.assert_array_equal(copied, expected)
        np.testing.assert_array_equal(frozen[i], np.arange(10, dtype="float32") * (i + 1))


@pytest.mark.parametrize("n, shape, dtype", [(1, (3,), "int64"), (2, (3, 2), "float32"), (3, (), "float64"),
                                             (8, (5,), "int32"), (16, (257,), "int64"), (2, (4, 3), "bfloat16")])
def test_the_ring_gathers_every_ranks_array_in_rank_order_on_every_rank(n, shape, dtype):
    # bfloat16: a bfloat16 embedding's sparse gradient (ml_dtypes, which the buffer protocol cannot name)
    dtype = getattr(ml_dtypes, dtype, dtype)
    arrays = [np.random.default_rng(i).integers(-1000, 1000, size=shape).astype(dtype) for i in range(n)]
    results = in_threads(n, lambda ring: [ring.all_gather(arrays[ring.rank] * k) for k in (1, 3)])
    for i, result in enumerate(results):
        assert not isinstance(result, Exception), f"rank {i}: {result!r}"
        for k, gathered in zip((1, 3), result):
            assert gathered.dtype == np.dtype(dtype) and gathered.shape == (n, *shape)
            np.testing.assert_array_equal(gathered, np.stack(arrays) * k)


def test_a_stranger_gets_nothing_and_the_ring_forms_anyway():
    socks, addresses = listeners(2)
    heard, connected = {}, threading.Event()

    def stranger():
        with socket.create_connection(socks[0].getsockname(), timeout=10) as conn:
            connected.set()  # in rank 0's backlog (the kernel completed the connection), before rank 1
            heard["nonce"] = len(conn.recv(NONCE_BYTES))
            conn.sendall(b"\x00\x00\x00\x01" + b"x" * (NONCE_BYTES + 32))  # rank 1, without the secret
            heard["after"] = conn.recv(64)  # closed, no welcome

    intruder = threading.Thread(target=stranger)
    intruder.start()
    assert connected.wait(10)
    results = two_ranks_sum(socks, addresses)
    intruder.join(30)
    assert heard == {"nonce": NONCE_BYTES, "after": b""}
    assert results == [[3.0], [3.0]]


def test_a_peer_with_another_secret_is_refused_in_words_on_both_sides():
    started = time.monotonic()
    results = in_threads(2, lambda ring: ring.all_reduce_sum(np.ones(3)), secrets=[SECRET, b"another job"], timeout=3)
    assert time.monotonic() - started < 30
    for result in results:
        assert isinstance(result, WorkerError) and not result.retryable, result
        assert "secret" in str(result)


def test_a_rank_that_goes_silent_fails_the_others_with_a_retryable_error_naming_it():
    def work(ring):
        if ring.rank == 2:
            return "left"  # closes its connections without reducing
        return ring.all_reduce_sum(np.ones(10))

    started = time.monotonic()
    results = in_threads(3, work, timeout=3)
    assert time.monotonic() - started < 30
    assert results[2] == "left"
    assert isinstance(results[0], WorkerError) and results[0].retryable, results[0]
    assert results[0].worker == 2 and "went silent" in str(results[0])
    assert isinstance(results[1], WorkerError) and results[1].retryable, results[1]


def test_an_encrypted_ring_sums_over_tls_13_with_the_jobs_certificate():
    job = Credentials.new()
    arrays = [np.arange(1000, dtype="float32") * (i + 1) for i in range(3)]
    results = in_threads(3, lambda ring: (ring.all_reduce_sum(arrays[ring.rank]), ring.encryption), tls=[job] * 3)
    for result in results:
        assert not isinstance(result, Exception), result
        np.testing.assert_array_equal(result[0], np.sum(arrays, axis=0))
        assert result[1].startswith("TLSv1.3 "), result[1]


def test_strangers_get_nothing_from_an_encrypted_ring_which_forms_anyway():
    """One stranger speaks plain TCP, the other completes TLS (a client may, trusting anything) but holds no
    secret: neither gets a byte of the ring's, and its ranks still meet."""
    job = Credentials.new()
    socks, addresses = listeners(2)
    heard, arrived = {}, threading.Semaphore(0)
    anything = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anything.check_hostname, anything.verify_mode = False, ssl.CERT_NONE

    def plain():
        with socket.create_connection(socks[0].getsockname(), timeout=10) as conn:
            arrived.release()
            conn.sendall(b"\x00\x00\x00\x01" + b"x" * (NONCE_BYTES + 32))
            try:
                heard["plain"] = conn.recv(64)  # a TLS alert at most, then closed: no nonce, no welcome
            except ConnectionError:
                heard["plain"] = b""

    def tls():
        with anything.wrap_socket(socket.create_connection(socks[0].getsockname(), timeout=10)) as conn:
            arrived.release()
            heard["tls nonce"] = len(conn.recv(NONCE_BYTES))
            conn.sendall(b"\x00\x00\x00\x01" + b"x" * (NONCE_BYTES + 32))  # rank 1, without the secret
            try:
                heard["tls after"] = conn.recv(64)
            except (ssl.SSLError, ConnectionError):
                heard["tls after"] = b""

    strangers = [threading.Thread(target=plain), threading.Thread(target=tls)]
    strangers[0].start()
    assert arrived.acquire(timeout=10)
    strangers[1].start()
    time.sleep(0.5)  # the TLS stranger is in rank 0's backlog before rank 1 connects
    results = two_ranks_sum(socks, addresses, tls=job)
    for stranger in strangers:
        stranger.join(30)
    assert not heard["plain"].startswith(b"\x00" * 4) and len(heard["plain"]) < NONCE_BYTES, heard
    assert heard["tls nonce"] == NONCE_BYTES and heard["tls after"] == b"", heard
    assert results == [[3.0], [3.0]]


def test_a_peer_with_another_jobs_certificate_is_refused_in_words_naming_tls():
    started = time.monotonic()
    results = in_threads(2, lambda ring: ring.all_reduce_sum(np.ones(3)), tls=[Credentials.new(), Credentials.new()],
                         timeout=3)
    assert time.monotonic() - started < 30
    for result in results:
        assert isinstance(result, WorkerError), result
    assert any("did not present the job's certificate" in str(r) and not r.retryable for r in results), results


@pytest.mark.parametrize("tls", [None, Credentials.new()], ids=["plain", "tls"])
def test_a_silent_stranger_holding_a_connection_open_does_not_delay_the_ring(tls):
    socks, addresses = listeners(2)
    with socket.create_connection(socks[0].getsockname(), timeout=10), \
            socket.create_connection(socks[1].getsockname(), timeout=10):  # first in both backlogs, then quiet
        time.sleep(0.2)
        started = time.monotonic()
        results = two_ranks_sum(socks, addresses, tls=tls, timeout=20)
        took = time.monotonic() - started
    assert results == [[3.0], [3.0]]
    assert took < 3, f"the ring waited {took:.1f} s behind a stranger (admission's per-connection wait is 5 s)"


class RecordingRing(Ring):
    """tfbarrier's ring, noting the length of each array it sums: the gradient packs, in the order they cross."""

    def all_reduce_sum(self, array, in_place=False):
        self.summed = getattr(self, "summed", []) + [array.size]
        return super().all_reduce_sum(array, in_place=in_place)


def test_gradient_packs_cross_the_ring_last_layers_first():
    """The backward pass makes the last layers' gradients first: their packs go first, so they travel while it
    goes on (issue 59). Packs of one gradient each: the order of the variables, reversed."""
    import tf_keras

    from tfbarrier.exchange.ring_hooks import exchange_gradients
    from tfbarrier.fitting.flavors import TfKeras

    lock = threading.Lock()

    def step(ring):
        with lock:  # built one at a time (Keras names layers from a counter of the process)
            model = tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(32), tf_keras.layers.Dense(3)])
            model.compile(tf_keras.optimizers.SGD(0.1), "mse")
            exchange_gradients(model.optimizer, ring, TfKeras(), {"bytes_per_pack": 4})
            sizes = [int(np.prod(v.shape)) for v in model.trainable_variables]
        model.fit(np.ones((4, 64), "float32"), np.ones((4, 3), "float32"), batch_size=4, verbose=0)
        return ring.summed, sizes

    orders = in_threads(2, step, timeout=20, ring_class=RecordingRing)
    for summed, sizes in orders:
        assert sizes == [64 * 32, 32, 32 * 3, 3]
        assert summed == sizes[::-1], f"packs crossed in the order {summed}, the variables' is {sizes}"


@pytest.mark.parametrize("n, sizes", [(2, [7, 0]), (3, [5, 11, 2]), (4, [1, 1, 40, 3])])
def test_chunks_of_any_sizes_are_reduce_scattered_and_gathered_in_segments(n, sizes, monkeypatch):
    # a sharded optimizer's packs (sharded_update.py): each rank ends with its own chunk of the sum, then every
    # chunk lands where it belongs; segments of 16 bytes (4 float32), so chunks cross in several, unevenly
    monkeypatch.setattr(ring_module, "SEGMENT_BYTES", 16)
    arrays = [np.random.default_rng(i).integers(-99, 99, sum(sizes)).astype("float32") for i in range(n)]
    total, bounds = np.sum(arrays, axis=0), np.cumsum([0, *sizes])

    def work(ring):
        mine = ring.reduce_scatter(arrays[ring.rank].copy(), sizes)
        others = ring.all_gather_chunks(mine * 2, sizes)
        whole = np.zeros(sum(sizes), "float32")
        whole[bounds[ring.rank]:bounds[ring.rank + 1]] = mine * 3
        ring.all_gather_into(whole, sizes)
        return mine, others, whole

    for rank, result in enumerate(in_threads(n, work)):
        assert not isinstance(result, Exception), result
        mine, others, whole = result
        np.testing.assert_array_equal(mine, total[bounds[rank]:bounds[rank + 1]])
        np.testing.assert_array_equal(others, np.delete(total, np.arange(bounds[rank], bounds[rank + 1])) * 2)
        np.testing.assert_array_equal(whole, total * 3)


def test_a_large_sum_lands_in_a_scratch_of_one_segment_not_of_one_chunk():
    # the scratch a reduce-scatter's incoming lands in lives as long as the ring: one chunk of a 200 MB
    # gradient's was 100 MB held by every training process for the whole fit
    arrays = [np.full(2 * ring_module.SEGMENT_BYTES, i + 1, np.float32) for i in range(2)]  # 8 segments a chunk
    results = in_threads(2, lambda ring: (ring.all_reduce_sum(arrays[ring.rank], in_place=True)[[0, -1]],
                                          ring._scratch.nbytes))
    for summed, scratch in results:
        np.testing.assert_array_equal(summed, [3, 3])
        assert scratch <= ring_module.SEGMENT_BYTES
