"""The link between the driver and its tasks (driver_link.py): only the job's token gets in, requests
get their answer, and a task that cannot reach the driver loses nothing but the link."""

import json
import socket
import time

from tfbarrier.spark import transfer
from tfbarrier.spark.driver_link import DriverLink, DriverServer, fetch
from tfbarrier.exchange.tls import Credentials


def wait_until(condition, seconds=5):
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.05)


def test_a_message_with_a_wrong_token_is_rejected():
    server = DriverServer("127.0.0.1")
    try:
        for token in ("not-the-token", server.token):
            with socket.create_connection((server.host, server.port)) as s:
                s.sendall(json.dumps({"token": token}).encode() + b"\n")
                s.sendall(json.dumps({"kind": "event", "worker": 0, "event": f"sent with {token}"}).encode() + b"\n")
        wait_until(lambda: server.events and server.rejected)
    finally:
        server.close()
    assert [m["event"] for m in server.events] == [f"sent with {server.token}"]
    assert server.rejected == 1
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
            size = fetch(server.endpoint, model.name, str(tmp_path / "model.bin"))
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
