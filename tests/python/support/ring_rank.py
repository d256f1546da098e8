"""One rank of a ring of two in a process of its own, its descriptors few (issue 72's flood).

    python ring_rank.py RANK TIMEOUT NOFILE    prints its listening port, reads the ring's addresses (one
                                               line, JSON), joins, sums [RANK + 1.0], prints one JSON line:
                                               {"sum"} or {"error", "retryable"}, and "seconds" to join"""

import json
import resource
import socket
import sys
import time

from tfbarrier.errors import WorkerError
from tfbarrier.exchange.ring import Ring

import numpy as np


def main(rank, timeout, nofile):
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    print(listener.getsockname()[1], flush=True)
    addresses = json.loads(sys.stdin.readline())
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    started = time.monotonic()
    try:
        ring = Ring.join(rank, addresses, b"the job's secret", listener, timeout=timeout)
        outcome = {"sum": ring.all_reduce_sum(np.array([rank + 1.0])).tolist()}
        ring.close()
    except WorkerError as exc:
        outcome = {"error": str(exc), "retryable": exc.retryable}
    print(json.dumps(dict(outcome, seconds=time.monotonic() - started)), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
