"""Another local user (issue 58): started as root, it becomes ``nobody`` before it looks at anything, then
tries to take every spare it can find and make it run code. With ``--same-user`` it stays the user it was
started as: a process of the executor's user that is no child of the executor (issue 76).

    python intruder.py MARKER [--same-user]    prints "RESULT {sockets, taken, uid}" as one JSON line

It reads the world-readable /proc/net/unix for the spares' keepers' sockets (Linux's abstract namespace:
no file permissions), connects to each and waits for a training process's channel. For each channel it
gets, it plants a job in a directory of its own whose unpickling creates the file MARKER, and sends the
spare a job message naming that directory (training_process.main's protocol). Standard library only."""

import json
import os
import pickle
import socket
import sys
import tempfile
import time

NOBODY = 65534


class Planted:
    """Unpickled, it opens MARKER for writing: proof that the spare loaded what this user planted."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def keeper_sockets():
    with open("/proc/net/unix") as f:
        paths = [line.split()[-1] for line in f.readlines()[1:] if len(line.split()) > 7]
    return sorted({"\0" + path[1:] for path in paths if path.startswith("@tfbarrier-spares-")})


def take(path, marker):
    """Whether the keeper at ``path`` handed over a channel (and the job was sent on it)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(5)
    try:
        conn.connect(path)
        _, fds, _, _ = socket.recv_fds(conn, 65536, 1)
    except OSError:
        return False
    if not fds:
        return False
    planted = tempfile.mkdtemp(prefix="planted-")
    os.chmod(planted, 0o755)
    with open(os.path.join(planted, "job.pkl"), "wb") as f:
        pickle.dump(Planted(marker), f)
    channel = socket.socket(fileno=fds[0])
    channel.sendall(json.dumps({"event": "job", "workdir": planted, "env": {}, "previous_log": os.devnull,
                                "sent_at": time.time()}).encode() + b"\n")
    time.sleep(1)
    return True


def main(marker, same_user=False):
    if not same_user:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    sockets = keeper_sockets()
    taken = sum(take(path, marker) for path in sockets)
    print("RESULT " + json.dumps({"sockets": len(sockets), "taken": taken, "uid": os.getuid()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], same_user="--same-user" in sys.argv[2:])
