"""Peers find each other (rendezvous.py): reserved ports, the rendezvous through the driver and its
fallback, TF_CONFIG and the agreed step count; run() and apply() meet through the driver too."""

import json
import re
import socket
import threading
import time

import pytest

from tfbarrier.spark import rendezvous
from tfbarrier import settings
from tfbarrier.spark.driver_link import DriverLink, DriverServer
from tfbarrier.errors import PortClashError
from tfbarrier.faults import port_clash_is_retryable


def test_a_reserved_port_cannot_be_taken_until_released():
    reserved = rendezvous.reserve_port()
    port = reserved.getsockname()[1]
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("", port))
    reserved.close()
    with socket.socket() as other:
        other.bind(("", port))


def test_tensorflow_failing_on_a_taken_port_is_seen_as_a_port_clash():
    import tensorflow as tf

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = tf.train.ClusterSpec({"worker": [f"localhost:{port}"]})
        with pytest.raises(PortClashError), port_clash_is_retryable():
            tf.distribute.Server(cluster, job_name="worker", task_index=0, protocol="grpc", start=True)


def test_tf_config_lists_every_peer_and_names_this_worker():
    peers = [{"host": "10.0.0.1", "port": 4001}, {"host": "fe80::1", "port": 4002}]
    config = rendezvous.tf_config(peers, 1)
    assert json.loads(json.dumps(config)) == {
        "cluster": {"worker": ["10.0.0.1:4001", "[fe80::1]:4002"]},
        "task": {"type": "worker", "index": 1},
    }


def test_one_worker_config_is_a_list_not_a_string():
    # jsonlite's auto_unbox trap: TensorFlow rejects {"worker": "host:port"}
    assert rendezvous.tf_config([{"host": "h", "port": 1}], 0)["cluster"]["worker"] == ["h:1"]


@pytest.mark.parametrize("rows, batch, steps", [
    ([700, 300], 64, 16),   # uneven shards: one pass over all 1000 rows
    ([1], 64, 1),           # never zero steps
    ([640, 640], 64, 20),
])
def test_steps_per_epoch_is_one_pass_over_all_rows(rows, batch, steps):
    assert rendezvous.steps_per_epoch(rows, batch) == steps


def _meet(links, attempt=1):
    """Every link's answer to the rendezvous request, each sent from a thread of its own (as tasks do)."""
    answers = {}

    def ask(link):
        answers[link.worker] = link.request(rendezvous.REQUEST, attempt=attempt, info={"w": link.worker})

    threads = [threading.Thread(target=ask, args=(link,)) for link in links]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def _driver(size, wait=settings.RENDEZVOUS_WAIT):
    meeting = rendezvous.DriverRendezvous(size, wait)
    return meeting, DriverServer("127.0.0.1", requests={rendezvous.REQUEST: meeting.answer})


def test_the_driver_hands_every_task_the_peers_in_task_order():
    meeting, server = _driver(3)
    links = [DriverLink(server.endpoint, worker=w) for w in (2, 0, 1)]
    try:
        answers = _meet(links)
    finally:
        for link in links:
            link.close()
        meeting.close()
        server.close()
    assert answers == {w: {"peers": [{"w": 0}, {"w": 1}, {"w": 2}]} for w in range(3)}
    assert server.events == []  # a rendezvous is not a progress message


def test_when_one_task_cannot_reach_the_driver_every_task_falls_back_to_allgather():
    meeting, server = _driver(2, wait=1.0)
    connected, unreachable = DriverLink(server.endpoint, worker=0), DriverLink(None, worker=1)
    try:
        started = time.monotonic()
        answers = _meet([connected, unreachable])
        waited = time.monotonic() - started
        late_link = DriverLink(server.endpoint, worker=1)
        late = late_link.request(rendezvous.REQUEST, attempt=1, info={"w": 1})  # after the driver gave up
        late_link.close()
    finally:
        connected.close()
        meeting.close()
        server.close()
    assert answers == {0: {"fallback": True}, 1: None} and late == {"fallback": True}
    assert waited < 10  # told to fall back after the wait, not left waiting


RENDEZVOUS_LINE = re.compile(r"\[worker (\d)\] rendezvous: 2 workers through (\w+) in ([0-9.]+) s")


def rendezvous_lines(output):
    """{worker: (how, seconds)} from the verbose=2 lines of a job's rendezvous."""
    return {int(w): (how, float(seconds)) for w, how, seconds in RENDEZVOUS_LINE.findall(output)}


def print_and_return_index():
    import json
    import os

    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    print(f"hello from run in worker {index}", flush=True)
    return index


def test_run_meets_through_the_driver_and_streams_the_functions_lines(spark, capsys):
    import tfbarrier

    assert tfbarrier.run(print_and_return_index, num_workers=2, verbose=2) == 0
    output = capsys.readouterr().err
    assert "[worker 0] hello from run in worker 0" in output
    assert "[worker 1] hello from run in worker 1" in output
    met = rendezvous_lines(output)
    assert sorted(met) == [0, 1] and {how for how, _ in met.values()} == {"driver"}
    # The last task to arrive waits for nobody: Spark's allGather would still take a whole second.
    assert min(seconds for _, seconds in met.values()) < 0.5


def test_tasks_that_cannot_reach_the_driver_meet_through_allgather(spark):
    import cloudpickle

    from tfbarrier.spark import stage
    from tfbarrier.functions.jobs import RunJob
    from tfbarrier.user_code import pickle_user_code
    from tfbarrier.spark.transfer import Payload

    with socket.socket() as closed:  # a port nobody listens on: what a firewall looks like to a task
        closed.bind(("127.0.0.1", 0))
        unreachable = {"host": "127.0.0.1", "port": closed.getsockname()[1], "token": "t"}
    function = pickle_user_code((print_and_return_index, (), {}), print_and_return_index)
    job = RunJob(function=Payload("function.pkl", len(function), function), link=unreachable, started_at=time.time())
    results, _ = stage.submit(spark.range(0, 2, numPartitions=2), job)
    assert [r.rendezvous_via for r in results] == ["allGather", "allGather"]
    assert [r.transfer["via"] for r in results] == ["spark", "spark"]  # the function came inside the job...
    assert cloudpickle.loads(results[0].files["value"].data) == 0  # ...and the value inside the result


def partition_size(partition, barrier):
    import pandas as pd

    print(f"apply in worker {barrier['partition']}", flush=True)
    return pd.DataFrame({"rows": [len(partition)]})


def test_apply_meets_through_the_driver_too(spark, capsys):
    import tfbarrier

    frame = tfbarrier.apply(spark.range(10).repartition(2), partition_size, num_workers=2, verbose=2)
    output = capsys.readouterr().err
    assert frame["rows"].sum() == 10 and "[worker 1] apply in worker 1" in output
    met = rendezvous_lines(output)
    assert {how for how, _ in met.values()} == {"driver"} and min(seconds for _, seconds in met.values()) < 0.5
