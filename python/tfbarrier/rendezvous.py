"""Peers find each other: ports, the rendezvous (through the driver, else the barrier's allGather),
TF_CONFIG and the agreed step count.

Ports are never fixed: each training process binds port 0 on its own host and keeps that socket
open (bound, not listening) while the peers gather, so no other process can be handed the port; the
socket is closed right before TensorFlow's server binds it. A clash in that instant is reported as a
``PortClashError`` and the driver retries the stage.
"""

import json
import math
import socket


def reserve_port():
    """A bound socket on a free TCP port of this host; close it right before the port is used."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    return sock


def task_host(context):
    """This barrier task's host, as Spark reports it (the executor address, without its port)."""
    address = context.getTaskInfos()[context.partitionId()].address
    return address.rsplit(":", 1)[0]


def gather(context, info, reporter=None, attempt=1):
    """Exchange a small JSON-able dict with every task of the stage; the list is in task order, and
    how it came: through the driver (``reporter``, milliseconds) or Spark's allGather (whole seconds)."""
    peers = reporter.gather(attempt, info) if reporter is not None else None
    if peers is not None:
        return peers, "driver"
    return [json.loads(message) for message in context.allGather(json.dumps(info))], "allGather"


def _endpoint(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tf_config(peers, index):
    """The TF_CONFIG dict of worker ``index``: every peer is a worker, worker 0 is the chief."""
    return {
        "cluster": {"worker": [_endpoint(p["host"], p["port"]) for p in peers]},
        "task": {"type": "worker", "index": index},
    }


def steps_per_epoch(shard_rows, global_batch_size):
    """The number of steps every worker runs per epoch: one pass over all rows at the global batch
    size. Shards may be uneven; each worker repeats its own shard, so all run the same count and the
    collectives never wait for a worker that ran out of data."""
    return max(1, math.ceil(sum(shard_rows) / global_batch_size))
