"""What a barrier task and its training process say to each other, and how a task's result reaches
the driver.

Task and training process share a work directory and a socket pair. Over the socket go JSON lines,
each an ``event``::

    task -> process   JOB       the work directory and the task's environment (the job is in JOB_FILE)
    process -> task   PORT      the port it reserved for TensorFlow
    task -> process   CONFIG    TF_CONFIG, the agreed steps per epoch, the shard and its rows
    process -> task   PROGRESS  steps, loss and epoch logs (also the stall watchdog's heartbeat)
    process -> task   DONE      the result is in RESULT_FILE

In the work directory: the job (JOB_FILE), the process's output (LOG_FILE), its result (RESULT_FILE)
or, when it fails, its exception (ERROR_FILE); the process's exit code says which failure it was
(faults.py).
On STACKS_SIGNAL the process writes its Python threads' stacks to its output (a stalled worker's).

The task hands its result to the driver as rows of at most CHUNK bytes (Spark Connect caps the size
of a message): ``result_batches`` on the task, ``results_from_rows`` on the driver.
"""

import json
import os
import pickle
import select
import signal
import traceback

from tfbarrier import atomic

JOB, PORT, CONFIG, PROGRESS, DONE = "job", "port", "config", "progress", "done"

JOB_FILE = "job.pkl"
RESULT_FILE = "result.pkl"
LOG_FILE = "worker.log"
ERROR_FILE = "error.json"
SHARD_FILE = "shard.arrow"
VALIDATION_FILE = "validation.arrow"  # next to SHARD_FILE: the worker's validation rows (fit)

STACKS_SIGNAL = signal.SIGUSR1


RESULT_SCHEMA = "index int, chunk int, payload binary"
CHUNK = 16 * 2**20


class Channel:
    """Newline-delimited JSON messages over a connected socket."""

    def __init__(self, sock):
        self._sock = sock
        self._buffer = b""

    def send(self, event, **fields):
        self._sock.sendall(json.dumps({"event": event, **fields}).encode() + b"\n")

    def poll(self, timeout):
        """The next message, or None when none arrived within ``timeout`` seconds.
        Raises EOFError when the other side closed the socket."""
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._sock], [], [], timeout)
            if not ready:
                return None
            chunk = self._sock.recv(65536)
            if not chunk:
                raise EOFError("the other side closed the channel")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def wait_for(self, event):
        """The next message named ``event`` (others are dropped), however long it takes."""
        while True:
            message = self.poll(None)
            if message.get("event") == event:
                return message

    def fileno(self):
        return self._sock.fileno()

    def close(self):
        self._sock.close()


def write_pickle(workdir, name, value):
    with atomic.private_file(os.path.join(workdir, name)) as f:
        pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)


def read_pickle(workdir, name):
    with open(os.path.join(workdir, name), "rb") as f:
        return pickle.load(f)


def write_error(workdir, exc):
    """Describe ``exc`` (being handled) for the task: its class, module, message and traceback."""
    info = {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc),
            "traceback": traceback.format_exc()}
    with atomic.private_file(os.path.join(workdir, ERROR_FILE), "w") as f:
        json.dump(info, f)


def read_error(workdir):
    """What ``write_error`` wrote, or {} when the process died without a word."""
    try:
        with open(os.path.join(workdir, ERROR_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def result_batches(index, result):
    """Task ``index``'s ``result`` as Arrow record batches of RESULT_SCHEMA."""
    import pyarrow as pa

    schema = pa.schema([("index", pa.int32()), ("chunk", pa.int32()), ("payload", pa.binary())])
    payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    for number, start in enumerate(range(0, len(payload), CHUNK)):
        yield pa.RecordBatch.from_arrays(
            [pa.array([index], pa.int32()), pa.array([number], pa.int32()),
             pa.array([payload[start:start + CHUNK]], pa.binary())],
            schema=schema,
        )


def results_from_rows(rows):
    """The tasks' results in task order, each reassembled from its chunks (Spark Rows of RESULT_SCHEMA)."""
    payloads = {}
    for row in sorted(rows, key=lambda r: (r["index"], r["chunk"])):
        payloads.setdefault(row["index"], []).append(bytes(row["payload"]))
    return [pickle.loads(b"".join(chunks)) for _, chunks in sorted(payloads.items())]
