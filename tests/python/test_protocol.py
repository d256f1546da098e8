"""The task <-> training process protocol, and results on their way from a task to the driver."""

import socket

import pyarrow as pa
import pytest

from tfbarrier import protocol
from tfbarrier.results import ProcessReport, WorkerResult


def spark_rows(batches):
    """What the driver's collect() makes of a task's record batches: one dict per row."""
    return [row for batch in batches for row in pa.Table.from_batches([batch]).to_pylist()]


def test_results_come_back_whole_from_chunks_in_worker_order():
    def report(weights):
        return ProcessReport(timings={"training": 1.0}, python_prefix="/venv", output={"weights": weights})

    big = WorkerResult.of_task(report(b"x" * (2 * protocol.CHUNK + 123)), {"rendezvous": 0.01}, index=1, rows=5)
    small = WorkerResult.of_task(report(b"y"), {}, index=0, rows=3)
    rows = spark_rows(protocol.result_batches(1, big)) + spark_rows(protocol.result_batches(0, small))
    assert len(rows) == 4  # three chunks of the big one
    assert protocol.results_from_rows(list(reversed(rows))) == [small, big]


def test_a_worker_result_joins_the_tasks_timings_and_its_processes():
    report = ProcessReport(timings={"training": 2.0, "tensorflow_import": 4.0}, python_prefix="/venv", steps=7)
    result = WorkerResult.of_task(report, {"rendezvous": 0.01}, index=0, host="h", rows=10)
    assert result.timings == {"training": 2.0, "tensorflow_import": 4.0, "rendezvous": 0.01}
    assert result.public()["steps"] == 7 and result.public()["rows"] == 10
    assert "output" not in result.public()


def test_messages_cross_the_channel_in_order_and_a_closed_channel_ends_with_eof():
    ours, theirs = socket.socketpair()
    sender, receiver = protocol.Channel(ours), protocol.Channel(theirs)
    sender.send(protocol.PORT, port=1234)
    sender.send(protocol.PROGRESS, steps=1)
    sender.send(protocol.CONFIG, rows=5)
    assert receiver.poll(1) == {"event": protocol.PORT, "port": 1234}
    assert receiver.wait_for(protocol.CONFIG) == {"event": protocol.CONFIG, "rows": 5}  # PROGRESS passed over
    assert receiver.poll(0.1) is None
    sender.close()
    with pytest.raises(EOFError):
        receiver.poll(1)
    receiver.close()
