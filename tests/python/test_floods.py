"""No stranger's flood stops a job (issue 72): a process on an address of its own (support/flood.py) keeps
hundreds of silent connections open to every port tfbarrier listens on and sends lines that never end. The
driver's link reads a few kilobytes of a stranger and lets few wait at once (driver_link.py), a rank's ring
port likewise (exchange/ring.py), even with few descriptors to spare: the job goes on, and the driver does not
grow. A flood the ring cannot tell from its peer fails the join within seconds, naming it, not retried."""

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import tf_keras
from conftest import training_processes

from support import flood as flood_process
from support import ring_rank, stranger
from support.peak_memory import PeakMemory

import tfbarrier
from tfbarrier.exchange import ring_admission
from tfbarrier.exchange.ring import Ring
from tfbarrier import waiting_room
from tfbarrier.spark import transfer
from tfbarrier.spark.driver_link import DriverLink, DriverServer, fetch

MB = 2**20
SECRET = b"the job's secret"  # support/ring_rank.py's
GROWTH_LIMIT = 150 * MB  # the bound on the driver's growth under a flood


@contextlib.contextmanager
def flood(targets, source="127.0.0.2", idle=300, line_mb=300, lines=2, seconds=180):
    """A stranger flooding ``targets`` ("host:port" each) while the block runs; yields a dict that holds what
    it did once the block ended (per target: connections made, closed by the other side, MB of lines sent)."""
    command = [sys.executable, flood_process.__file__, "--source", source, "--idle", str(idle), "--line-mb",
               str(line_mb), "--lines", str(lines), "--seconds", str(seconds), *targets]
    stranger_ = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    did = {}
    try:
        assert stranger_.stdout.readline().strip() == "ready"
        yield did
    finally:
        stranger_.stdin.close()
        did.update(json.loads(stranger_.stdout.readline() or "{}"))
        stranger_.wait(timeout=30)


def a_tasks_work(server, model, path):
    """What a task does over the link (an event, a request, a fetch): what came of each, or the error raised."""
    try:
        link = DriverLink(server.endpoint, worker=0)
        link.event("started")
        answer = link.request("echo")
        size = fetch(server.endpoint, model.name, path, model.sha256)
        link.close()
        return {"answer": answer, "size": size}
    except Exception as exc:  # noqa: B902 - the test looks at it
        return {"error": repr(exc)}


def test_a_flood_of_the_driver_link_leaves_its_tasks_served_and_the_driver_its_size(tmp_path):
    with transfer.JobFiles() as files:
        model = files.add_bytes("model.bin", b"weights" * 100_000)
        server = DriverServer("127.0.0.1", files=files, requests={"echo": lambda message, reply: reply({"ok": 1})})
        threads = threading.active_count()
        try:
            with PeakMemory() as memory, flood([f"127.0.0.1:{server.port}"]) as did:
                time.sleep(2.0)  # the endless lines sent, the silent connections held
                most_threads = threading.active_count()
                served = a_tasks_work(server, model, str(tmp_path / "model.bin"))
        finally:
            server.close()
    assert memory.growth < GROWTH_LIMIT, f"the driver grew {memory.growth / MB:.0f} MB under the flood"
    assert most_threads - threads <= waiting_room.PER_SOURCE + 2, (threads, most_threads)
    assert served == {"answer": {"ok": 1}, "size": 700_000}, served
    assert [m["event"] for m in server.events] == ["started"]
    stats = did[f"127.0.0.1:{server.port}"]
    assert stats["made"] >= 300 and stats["closed"] > 0  # the flood was real, and turned away
    assert set(server.strangers) == {"127.0.0.2"}


def ring_rank_zero(timeout, nofile):
    """Rank 0 of a ring of two in a process of its own with ``nofile`` descriptors: (it, its port)."""
    rank = subprocess.Popen([sys.executable, ring_rank.__file__, "0", str(timeout), str(nofile)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return rank, int(rank.stdout.readline())


def test_a_flood_of_a_ranks_port_from_another_address_leaves_the_ring_to_form_and_sum():
    rank0, port0 = ring_rank_zero(timeout=60, nofile=128)
    listener1 = socket.create_server(("127.0.0.1", 0))
    addresses = [f"127.0.0.1:{port0}", f"127.0.0.1:{listener1.getsockname()[1]}"]
    rank1 = {}

    def join_as_rank_one():
        ring = Ring.join(1, addresses, SECRET, listener1, timeout=40)
        rank1["sum"] = ring.all_reduce_sum(np.array([2.0])).tolist()
        ring.close()

    try:
        rank0.stdin.write(json.dumps(addresses) + "\n")  # rank 0 joins: it admits, and waits for rank 1
        rank0.stdin.flush()
        with flood([addresses[0]], line_mb=1, lines=1) as did:
            time.sleep(1.0)  # the flood in rank 0's admission, its descriptors few, before rank 1 comes
            joining = threading.Thread(target=join_as_rank_one, daemon=True)
            joining.start()
            outcome = json.loads(rank0.stdout.readline())
            joining.join(60)
    finally:
        rank0.kill()
        rank0.wait()
        listener1.close()
    assert outcome.get("sum") == [3.0] and rank1 == {"sum": [3.0]}, outcome
    assert did[addresses[0]]["made"] >= 300 and did[addresses[0]]["closed"] > 0  # the flood was real


def test_a_flood_from_the_previous_ranks_own_address_fails_the_join_within_seconds_naming_it_not_retried():
    """The previous rank never gets in (here: it admits rank 0 on its own port, and never connects to rank 0's,
    which is what a flood from its own address that keeps it out looks like to rank 0)."""
    rank0, port0 = ring_rank_zero(timeout=60, nofile=128)
    listener1 = socket.create_server(("127.0.0.1", 0))
    addresses = [f"127.0.0.1:{port0}", f"127.0.0.1:{listener1.getsockname()[1]}"]
    half_peer = ring_admission.Admission(listener1, (SECRET, None), 0, time.monotonic() + 60)
    try:
        rank0.stdin.write(json.dumps(addresses) + "\n")
        rank0.stdin.flush()
        with flood([addresses[0]], source="127.0.0.1", line_mb=1, lines=1, seconds=60) as did:
            outcome = json.loads(rank0.stdout.readline())
    finally:
        half_peer.abandon()
        rank0.kill()
        rank0.wait()
        listener1.close()
    assert outcome["seconds"] < 30 and not outcome["retryable"], outcome
    assert "flooded" in outcome["error"] and "from 127.0.0.1" in outcome["error"], outcome
    assert did[addresses[0]]["made"] >= 300  # the flood was real


def listening_ports(pid):
    return set(stranger.listening_ports([pid]))


def test_a_flood_of_every_port_of_a_fit_leaves_it_to_finish_and_the_driver_its_size(spark, digits_df):
    model = tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(10, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    before, outcome = listening_ports(psutil.Process().pid), {}
    fit = threading.Thread(target=lambda: outcome.update(result=tfbarrier.fit(
        digits_df, model, features="pixels", label="digit", epochs=2, batch_size=64, num_workers=2,
        steps_per_epoch=10, verbose=0)))
    flooded, floods = set(), contextlib.ExitStack()
    with PeakMemory() as memory, floods:
        started = time.monotonic()
        fit.start()
        while fit.is_alive():  # the driver's link, then each training process's ring port, as they open
            ports = listening_ports(psutil.Process().pid) - before
            ports |= set(stranger.listening_ports(training_processes()))
            for port in ports - flooded:
                floods.enter_context(flood([f"127.0.0.1:{port}"], seconds=120))
            flooded |= ports
            time.sleep(0.05)
        fit.join()
    took = time.monotonic() - started
    assert flooded, "no port of the fit was found to flood"
    result = outcome["result"]
    assert [w["steps"] for w in result.workers] == [20, 20]
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    assert memory.growth < GROWTH_LIMIT, f"the driver grew {memory.growth / MB:.0f} MB under the flood"
    assert took < 240
