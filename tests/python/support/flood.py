"""A stranger's flood of a job's ports (issue 72): from an address of its own, it keeps ``--idle`` connections
open to each target that say nothing (one more as soon as one is closed), and sends each target lines that
never end (``--line-mb`` each, ``--lines`` of them, one connection each).

    python flood.py --source 127.0.0.2 --idle 300 --line-mb 300 --lines 2 --seconds 60 HOST:PORT [HOST:PORT...]

It prints "ready" once ``--idle`` connections were made to each target (or after 3 s), and, when it ends (after ``--seconds``, or
when its standard input closes), one JSON line: connections made and closed by the other side, per target."""

import argparse
import json
import os
import socket
import sys
import threading
import time

CHUNK = b"x" * 2**20


def connect(target, source):
    host, port = target.rsplit(":", 1)
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect((host, int(port)))
    return sock


def keep_idle(target, args, stats, stop):
    """``args.idle`` connections to ``target``, each replaced once the other side closes it."""
    open_ = []
    while not stop.is_set():
        for _ in range(min(args.idle - len(open_), 20)):  # at most 400 new connections a second
            try:
                open_.append(connect(target, args.source))
                stats["made"] += 1
            except OSError:
                time.sleep(0.01)
        stats["ready"] = stats["ready"] or len(open_) >= args.idle or stats["made"] >= args.idle
        still = []
        for sock in open_:
            sock.setblocking(False)
            try:
                if sock.recv(65536) == b"":
                    raise ConnectionError
                still.append(sock)
            except BlockingIOError:
                still.append(sock)
            except OSError:
                stats["closed"] += 1
                sock.close()
        open_ = still
        time.sleep(0.05)
    for sock in open_:
        sock.close()


def send_endless_line(target, args, stats, stop):
    """A line of ``args.line_mb`` MB that never ends, on a connection of its own."""
    try:
        sock = connect(target, args.source)
        for _ in range(args.line_mb):
            if stop.is_set():
                break
            sock.sendall(CHUNK)
            stats["line_mb_sent"] += 1
        sock.close()
    except OSError:
        stats["line_cut"] += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("targets", nargs="+")
    parser.add_argument("--source", default="127.0.0.2")
    parser.add_argument("--idle", type=int, default=300)
    parser.add_argument("--line-mb", type=int, default=300)
    parser.add_argument("--lines", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    stats = {target: {"made": 0, "closed": 0, "ready": False, "line_mb_sent": 0, "line_cut": 0}
             for target in args.targets}
    threads = [threading.Thread(target=keep_idle, args=(t, args, stats[t], stop), daemon=True) for t in args.targets]
    threads += [threading.Thread(target=send_endless_line, args=(t, args, stats[t], stop), daemon=True)
                for t in args.targets for _ in range(args.lines)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + args.seconds
    ready_by = time.monotonic() + min(3.0, args.seconds)  # a listener that accepts nothing takes its backlog only
    while not all(s["ready"] for s in stats.values()) and time.monotonic() < ready_by and not stop.is_set():
        time.sleep(0.05)
    print("ready", flush=True)
    stop.wait(max(0.0, deadline - time.monotonic()))
    stop.set()
    for thread in threads:
        thread.join(10)
    print(json.dumps({t: {k: v for k, v in s.items() if k != "ready"} for t, s in stats.items()}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
