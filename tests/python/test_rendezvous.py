"""Ports, TF_CONFIG and the agreed step count."""

import json
import socket

import pytest

from tfbarrier import rendezvous, worker


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
        with pytest.raises(Exception) as failure:
            tf.distribute.Server(cluster, job_name="worker", task_index=0, protocol="grpc", start=True)
    assert worker._is_port_clash(failure.value)


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
