"""A stranger to a fit (issue 44): a process outside the job, with no secret and no Spark access, that
does what a plain TensorFlow client can do to a training process: place tf.io.read_file on
/job:worker/task:N through the server at HOST:PORT and print what comes back.

    python stranger.py HOST PORT PATH    prints "READ <the file>" or "REFUSED <why>" per task

``attempt`` runs it against every port the given training processes listen on (``listening_ports``)."""

import os
import subprocess
import sys

TASKS = (0, 1)


def listening_ports(pids):
    """The TCP ports the processes ``pids`` listen on, each read in its own network namespace (its
    /proc/PID/net: psutil reads the caller's, and finds nothing of a process on another host)."""
    ports = set()
    for pid in pids:
        try:
            links = (_link(pid, fd) for fd in os.listdir(f"/proc/{pid}/fd"))
            sockets = {link[len("socket:["):-1] for link in links if link.startswith("socket:[")}
            for table in ("tcp", "tcp6"):
                with open(f"/proc/{pid}/net/{table}") as f:
                    rows = [line.split() for line in f.readlines()[1:]]
                # local address "ADDR:PORT" in hex, state 0A is LISTEN, the socket's inode
                ports |= {int(row[1].rsplit(":", 1)[1], 16) for row in rows if row[3] == "0A" and row[9] in sockets}
        except (FileNotFoundError, ProcessLookupError):  # it exited
            continue
    return sorted(ports)


def _link(pid, fd):
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:  # closed meanwhile
        return ""


def attempt(host, ports, path):
    """What the stranger got from each port of ``host``: [its output per port]."""
    return [subprocess.run([sys.executable, __file__, host, str(port), path], capture_output=True, text=True,
                           timeout=120).stdout for port in ports]


def read_through(host, port, path):
    import tensorflow as tf

    for task in TASKS:
        with tf.Graph().as_default():
            with tf.device(f"/job:worker/task:{task}"):
                read = tf.io.read_file(path)
            config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=5000)
            try:
                with tf.compat.v1.Session(f"grpc://{host}:{port}", config=config) as session:
                    print("READ", session.run(read).decode(), flush=True)
            except Exception as exc:  # noqa: BLE001 - what the server answered is the outcome
                print("REFUSED", type(exc).__name__, flush=True)


if __name__ == "__main__":
    read_through(*sys.argv[1:4])
