"""The link between the driver and its tasks (driver_link.py): only the job's token gets in, requests
get their answer, and a task that cannot reach the driver loses nothing but the link."""

import contextlib
import json
import socket
import subprocess
import sys
import time

import pytest

from support import on_path as on_path_attacker
from tfbarrier.errors import ClusterError
from tfbarrier.spark import link_wire, transfer
from tfbarrier.spark.driver_link import DriverLink, DriverServer, fetch
from tfbarrier.tls import Credentials


def wait_until(condition, seconds=5):
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.05)


def hello_with(server, token, **hello):
    """A connection to ``server`` that answered its nonce with a proof made of ``token``."""
    sock = socket.create_connection((server.host, server.port), timeout=5)
    nonce = bytes.fromhex(json.loads(sock.makefile("rb").readline())["nonce"])
    sock.sendall(json.dumps({**hello, "proof": link_wire.proof(token, nonce, hello)}).encode() + b"\n")
    return sock


def test_a_message_with_a_wrong_token_is_rejected():
    server = DriverServer("127.0.0.1")
    try:
        for token in ("not-the-token", server.token):
            with hello_with(server, token) as s:
                s.sendall(json.dumps({"kind": "event", "worker": 0, "event": f"sent with {token}"}).encode() + b"\n")
        with socket.create_connection((server.host, server.port)) as s:  # the old way: the token itself, sent
            s.sendall(json.dumps({"token": server.token}).encode() + b"\n")
            s.sendall(json.dumps({"kind": "event", "worker": 0, "event": "sent after the bare token"}).encode() + b"\n")
        wait_until(lambda: server.events and server.rejected == 2)
    finally:
        server.close()
    assert [m["event"] for m in server.events] == [f"sent with {server.token}"]
    assert server.rejected == 2
    with socket.socket() as s:  # nothing listens once the server is closed (REUSEADDR: its closed
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections may sit in TIME_WAIT)
        s.bind(("127.0.0.1", server.port))
        s.listen()


def test_messages_reach_the_listener_and_requests_their_handler_only():
    heard = []
    server = DriverServer("127.0.0.1", on_message=heard.append,
                          requests={"echo": lambda message, reply: reply({"echoed": message["text"]})})
    link = DriverLink(server.endpoint, worker=3)
    try:
        link.event("started", attempt=1)
        answer = link.request("echo", text="hello")
        wait_until(lambda: heard)
    finally:
        link.close()
        server.close()
    assert answer == {"echoed": "hello"}
    assert [(m["kind"], m["worker"], m["event"]) for m in heard] == [("event", 3, "started")]
    assert server.events == heard and server.workers_heard() == {3}


def test_a_task_that_cannot_reach_the_driver_sends_nothing_and_gets_no_answer():
    with socket.socket() as closed:  # a port nobody listens on: what a firewall looks like to a task
        closed.bind(("127.0.0.1", 0))
        unreachable = {"host": "127.0.0.1", "port": closed.getsockname()[1], "token": "t"}
    link = DriverLink(unreachable, worker=0)
    started = time.monotonic()
    link.event("started")
    answer = link.request("rendezvous", attempt=1, info={})
    link.close()
    assert answer is None and time.monotonic() - started < 1


def test_a_followed_log_is_sent_to_its_last_line_when_the_link_closes(tmp_path):
    server = DriverServer("127.0.0.1")
    log = tmp_path / "worker.log"
    log.write_text("first\n")
    link = DriverLink(server.endpoint, worker=1)
    link.follow(str(log))
    with open(log, "a") as f:
        f.write("last\n")
    link.close()  # right after the last write: the follower still sends it
    wait_until(lambda: len(server.events) >= 2)
    server.close()
    assert [m["line"] for m in server.events if m["kind"] == "log"] == ["first", "last"]


def test_an_encrypted_link_carries_messages_and_files_over_tls_and_refuses_plain_tcp(tmp_path):
    heard = []
    with transfer.JobFiles() as files:
        model = files.add_bytes("model.bin", b"weights" * 1000)
        server = DriverServer("127.0.0.1", on_message=heard.append, files=files, tls=Credentials.new(),
                              requests={"echo": lambda message, reply: reply({"echoed": message["text"]})})
        link = DriverLink(server.endpoint, worker=1)
        try:
            with socket.create_connection((server.host, server.port)) as plain:  # the right token, in the clear
                try:
                    plain.sendall(json.dumps({"token": server.token}).encode() + b"\n")
                    plain.sendall(json.dumps({"kind": "event", "worker": 9, "event": "plain"}).encode() + b"\n")
                except ConnectionResetError:  # the server refused the handshake before the second line
                    pass
            link.event("started")
            answer = link.request("echo", text="hello")
            size = fetch(server.endpoint, model.name, str(tmp_path / "model.bin"), model.sha256)
            (tmp_path / "trained.bin").write_bytes(b"trained" * 1000)
            link.put("trained.bin", str(tmp_path / "trained.bin"))
            wait_until(lambda: heard and server.rejected)
        finally:
            link.close()
            server.close()
        received = open(files.receiving("trained.bin"), "rb").read()
    assert server.endpoint["tls"].certificate.startswith(b"-----BEGIN CERTIFICATE")
    assert answer == {"echoed": "hello"} and [m["event"] for m in heard] == ["started"]
    assert size == 7000 and (tmp_path / "model.bin").read_bytes() == b"weights" * 1000
    assert received == b"trained" * 1000
    assert server.rejected == 1


@contextlib.contextmanager
def on_path(server, record, **swaps):
    """``server``'s endpoint as seen through an attacker on the path (support/on_path.py), which keeps what
    crosses in ``record`` and swaps bytes in what goes ``to_driver`` or ``to_task`` ((old, new) each)."""
    command = [sys.executable, on_path_attacker.__file__, str(server.port), str(record)]
    for way, (old, new) in swaps.items():
        command += ["--" + way.replace("_", "-"), old.hex(), new.hex()]
    attacker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield dict(server.endpoint, port=int(attacker.stdout.readline()))
    finally:
        attacker.stdin.close()
        attacker.wait(timeout=10)


def seen(record, way):
    """What the attacker saw go ``way``, by connection: {connection: bytes}."""
    by_connection = {}
    for line in record.read_text().splitlines():
        chunk = json.loads(line)
        if chunk["way"] == way:
            by_connection[chunk["connection"]] = by_connection.get(chunk["connection"], b"") + bytes.fromhex(chunk["bytes"])
    return by_connection


def answer_of(sock):
    """What the other end sent before it closed: b"" for nothing. A server that closes with our line unread in its
    buffer resets the connection (Linux sends RST then), which is a close without an answer too."""
    try:
        return sock.recv(100)
    except ConnectionResetError:
        return b""


def test_nothing_that_crosses_the_plain_link_lets_whoever_saw_it_in(tmp_path):
    record = tmp_path / "wire.jsonl"
    with transfer.JobFiles() as files:
        model = files.add_bytes("model.bin", b"weights" * 1000)
        server = DriverServer("127.0.0.1", files=files, requests={"echo": lambda message, reply: reply({"ok": 1})})
        try:
            with on_path(server, record) as endpoint:
                link = DriverLink(endpoint, worker=0)
                link.event("started")
                assert link.request("echo") == {"ok": 1}
                assert fetch(endpoint, model.name, str(tmp_path / "model.bin"), model.sha256) == 7000
                link.close()
            sent = seen(record, "to-driver")
            assert len(sent) == 3 and not any(server.token.encode() in data for data in sent.values())
            refused = server.rejected
            for data in sent.values():  # each connection's hello, replayed as it was on a connection of one's own
                with socket.create_connection((server.host, server.port), timeout=5) as replay:
                    replay.makefile("rb").readline()  # a new nonce
                    replay.sendall(data.split(b"\n")[0] + b"\n")
                    replay.sendall(json.dumps({"kind": "event", "worker": 0, "event": "replayed"}).encode() + b"\n")
                    assert answer_of(replay) == b""  # closed: no file, no answer
            wait_until(lambda: server.rejected == refused + 3)
        finally:
            server.close()
    assert server.rejected == refused + 3
    assert [m["event"] for m in server.events] == ["started"]


def test_a_file_changed_on_the_plain_link_is_refused_before_anything_reads_it(tmp_path):
    with transfer.JobFiles() as files:
        model = files.add_bytes("model.bin", b"W" * 5000)
        server = DriverServer("127.0.0.1", files=files)
        try:
            swaps = {"to_task": (b"WWWW", b"EVIL"), "to_driver": (b"TTTT", b"EVIL")}
            with on_path(server, tmp_path / "wire.jsonl", **swaps) as endpoint:
                with pytest.raises(link_wire.DigestMismatch, match="changed on the way"):
                    fetch(endpoint, model.name, str(tmp_path / "model.bin"), model.sha256)
                (tmp_path / "trained.bin").write_bytes(b"T" * 5000)
                link = DriverLink(endpoint, worker=0)
                returned = transfer.send_back({"weights": "trained.bin"}, link, str(tmp_path), 0)["weights"]
                link.close()
            assert returned.data is None  # it went over the link, and arrived changed
            assert b"EVIL" in open(files.receiving(returned.name), "rb").read()
            with pytest.raises(ClusterError, match="changed on the way"):
                files.received(returned)
        finally:
            server.close()
    assert not (tmp_path / "model.bin").exists()  # never put in place
