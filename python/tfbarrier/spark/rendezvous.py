"""Peers find each other: ports, the rendezvous (driver and task side), TF_CONFIG and the agreed
step count.

The rendezvous goes through the driver's link (driver_link.py): each task sends its host, port and
shard rows as a ``rendezvous`` request, and the driver answers every task with the list of all of
them once the last one arrived, within milliseconds (Spark's allGather waits in whole seconds: its
task thread sleeps 1 s between checks). When some task cannot reach the driver, every task is told
to fall back to allGather, ``settings.RENDEZVOUS_WAIT`` seconds after the first arrival.

Ports are never fixed: each training process binds port 0 on its own host and keeps that socket
open (bound, not listening) while the peers gather, so no other process can be handed the port; the
socket is closed right before TensorFlow's server binds it. A clash in that instant is reported as a
``PortClashError`` and the driver retries the stage.

A worker whose collective aborted for want of a peer asks its peers' hosts, at the ports they met
with, whether they are still there (``silent_peers``): a host that does not answer at all is lost.
"""

import errno
import json
import math
import socket
import threading

from tfbarrier import settings

REQUEST = "rendezvous"  # the driver link's request kind


def reserve_port():
    """A bound socket on a free TCP port of this host; close it right before the port is used."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    return sock


def task_host(context):
    """This barrier task's host, as Spark reports it (the executor address, without its port)."""
    address = context.getTaskInfos()[context.partitionId()].address
    return address.rsplit(":", 1)[0]


def gather(context, link, info, attempt=1):
    """Exchange a small JSON-able dict with every task of the stage; the list is in task order, and
    how it came: through the driver (``link``, a DriverLink) or Spark's allGather."""
    answer = link.request(REQUEST, attempt=attempt, info=info) if link is not None else None
    peers = answer.get("peers") if isinstance(answer, dict) else None
    if peers is not None:
        return peers, "driver"
    return [json.loads(message) for message in context.allGather(json.dumps(info))], "allGather"


class _Gathering:
    """One rendezvous (one submission of the job): the list of every task's info once all arrived,
    or, ``wait`` seconds after the first arrival, a fallback for all (including late arrivals)."""

    def __init__(self, size, wait):
        self.size = size
        self.infos, self.replies, self.outcome = {}, [], None
        self._lock = threading.Lock()
        self._timer = threading.Timer(wait, self._finish, [{"fallback": True}])
        self._timer.daemon = True
        self._timer.start()

    def arrive(self, worker, info, reply):
        with self._lock:
            if self.outcome is None:
                self.infos[worker] = info
                self.replies.append(reply)
                if len(self.infos) == self.size:
                    self._finish_locked({"peers": [self.infos[i] for i in range(self.size)]})
                return
        reply(self.outcome)

    def _finish(self, outcome):
        with self._lock:
            if self.outcome is None:
                self._finish_locked(outcome)

    def _finish_locked(self, outcome):
        self.outcome = outcome
        self._timer.cancel()
        for reply in self.replies:
            reply(outcome)
        self.replies = []

    def cancel(self):
        self._timer.cancel()


class DriverRendezvous:
    """The driver's side for a job of ``size`` tasks: the handler of REQUEST on the driver link, one
    gathering per submission (``attempt``)."""

    def __init__(self, size, wait=settings.RENDEZVOUS_WAIT):
        self.size, self.wait = size, wait
        self._gatherings = {}
        self._lock = threading.Lock()

    def answer(self, message, reply):
        """``reply`` gets {"peers": [...]} or {"fallback": true}."""
        worker, attempt = message.get("worker"), message.get("attempt")
        if not isinstance(worker, int) or not 0 <= worker < self.size:
            reply({"fallback": True})
            return
        with self._lock:
            gathering = self._gatherings.get(attempt)
            if gathering is None:
                gathering = self._gatherings[attempt] = _Gathering(self.size, self.wait)
        gathering.arrive(worker, message.get("info"), reply)

    def hosts(self, attempt):
        """{worker: host} of the tasks of submission ``attempt`` that arrived (empty when none did)."""
        gathering = self._gatherings.get(attempt)
        if gathering is None:
            return {}
        with gathering._lock:
            return {worker: (info or {}).get("host") for worker, info in gathering.infos.items()}

    def close(self):
        for gathering in self._gatherings.values():
            gathering.cancel()


_SILENT_ERRNOS = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN}


def _answers(host, port, timeout):
    """Whether ``host`` answers a TCP connection to ``port`` within ``timeout`` s. A refusal is an
    answer (the host is up, nothing listens there any more); silence, or no route, is none."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except (socket.timeout, TimeoutError):
        return False
    except OSError as exc:
        return exc.errno not in _SILENT_ERRNOS
    return True


def silent_peers(peers, index, timeout=settings.PEER_PROBE_TIMEOUT):
    """The indexes of the peers (other than ``index``) whose hosts do not answer at the ports they met
    with, asked all at once: at most ``timeout`` s."""
    others = [i for i in range(len(peers)) if i != index]
    answers = {}
    threads = [threading.Thread(target=lambda i=i: answers.__setitem__(
        i, _answers(peers[i]["host"], peers[i]["port"], timeout)), daemon=True) for i in others]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 1.0)
    return [i for i in others if answers.get(i) is False]


def _endpoint(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tf_config(peers, index):
    """The TF_CONFIG dict of worker ``index``: every peer is a worker, worker 0 is the chief."""
    return {
        "cluster": {"worker": [_endpoint(p["host"], p["port"]) for p in peers]},
        "task": {"type": "worker", "index": index},
    }


def validation_steps(validation_rows, global_batch_size):
    """The validation steps every worker runs: enough for the worker with the most validation rows,
    at its share of the global batch; the others pad their last batches with rows left out, so
    that every validation row counts once and no collective waits for a worker that ran out."""
    per_worker = global_batch_size // len(validation_rows)
    return max(math.ceil(rows / per_worker) for rows in validation_rows)


def steps_per_epoch(shard_rows, global_batch_size):
    """The number of steps every worker runs per epoch: one pass over all rows at the global batch
    size. Shards may be uneven; each worker repeats its own shard, so all run the same count and the
    collectives never wait for a worker that ran out of data."""
    return max(1, math.ceil(sum(shard_rows) / global_batch_size))
