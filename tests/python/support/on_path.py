"""An attacker on the path between a job's tasks and its driver's link (issue 72): a process that relays
every connection made to it on to the driver, keeps what crossed in each direction, and may change it.

    python on_path.py TARGET_PORT RECORD [--to-driver OLD NEW] [--to-task OLD NEW]

It listens on a loopback port of its own and prints it on its first line; each connection's bytes are
appended to RECORD (hex, one JSON line per chunk: {"connection", "way", "bytes"}); OLD is replaced by NEW
(hex, the same length) in what goes the named way. It ends when its standard input closes."""

import json
import os
import socket
import sys
import threading


def relay(source, sink, way, number, record, lock, swap):
    while True:
        try:
            chunk = source.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        if swap is not None:
            chunk = chunk.replace(*swap)
        with lock:
            record.write(json.dumps({"connection": number, "way": way, "bytes": chunk.hex()}) + "\n")
            record.flush()
        try:
            sink.sendall(chunk)
        except OSError:
            break
    for sock in (source, sink):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def main(argv):
    target, path, swaps = int(argv[0]), argv[1], {}
    for flag, old, new in zip(argv[2::3], argv[3::3], argv[4::3]):
        swaps[flag.strip("-")] = (bytes.fromhex(old), bytes.fromhex(new))
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    lock, record, number = threading.Lock(), open(path, "a"), 0
    while True:
        try:
            task, _ = listener.accept()
        except OSError:
            return
        driver = socket.create_connection(("127.0.0.1", target))
        number += 1
        for source, sink, way in ((task, driver, "to-driver"), (driver, task, "to-task")):
            threading.Thread(target=relay, args=(source, sink, way, number, record, lock, swaps.get(way)),
                             daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
