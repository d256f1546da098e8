"""Another local user squatting a keeper's name (issue 76): started as root, it becomes ``nobody``, listens on the
abstract Unix socket name given (hex-encoded) where the executor's keeper listened, and holds every task that
connects, handing nothing over, until the task closes its end or HOLD seconds pass.

    python squatter.py NAME_HEX    prints "LISTENING", then, once its stdin closes,
                                   "RESULT {uid, connections: [{closed_by_task, held}]}" as one JSON line

A task that checks who listens (spares.request: SO_PEERCRED) closes at once and starts its own process; one that
took the squatter for its keeper would wait for the handover until the squatter gave up. Standard library only."""

import json
import os
import select
import socket
import sys
import threading
import time

NOBODY = 65534
HOLD = 20.0  # longer than a task takes to write its shard and wait for its process


def hold(conn, connections):
    """Wait for the task to close its end; record whether it did, and after how long."""
    started = time.monotonic()
    closed = False
    while time.monotonic() - started < HOLD:
        if select.select([conn], [], [], 0.1)[0]:
            try:
                closed = conn.recv(65536) == b""
            except OSError:
                closed = True
            if closed:
                break
    connections.append({"closed_by_task": closed, "held": round(time.monotonic() - started, 2)})
    conn.close()


def main(name):
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen(16)
    print("LISTENING", flush=True)
    connections, holders = [], []
    while True:
        ready = select.select([listener, sys.stdin], [], [], 0.2)[0]
        if sys.stdin in ready and not sys.stdin.readline():  # the driver is done
            break
        if listener in ready:
            conn, _ = listener.accept()
            holders.append(threading.Thread(target=hold, args=(conn, connections)))
            holders[-1].start()
    for holder in holders:
        holder.join()
    print("RESULT " + json.dumps({"uid": os.getuid(), "connections": connections}), flush=True)


if __name__ == "__main__":
    main(bytes.fromhex(sys.argv[1]).decode())
