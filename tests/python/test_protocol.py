"""The task <-> training process protocol, and results on their way from a task to the driver."""

import socket

import pyarrow as pa
import pytest

from tfbarrier.spark import protocol
from tfbarrier.results import FitOutput, ProcessReport, WorkerResult


def spark_rows(batches):
    """What the driver's collect() makes of a task's record batches: one dict per row."""
    return [row for batch in batches for row in pa.Table.from_batches([batch]).to_pylist()]


def test_results_come_back_whole_from_chunks_in_worker_order():
    def result(index, weights):
        report = ProcessReport(timings={"training": 1.0}, python_prefix="/venv", output={"weights": weights})
        return WorkerResult(report, index=index, rows=5, timings=report.timings)

    big, small = result(1, b"x" * (2 * protocol.CHUNK + 123)), result(0, b"y")
    rows = spark_rows(protocol.result_batches(1, big)) + spark_rows(protocol.result_batches(0, small))
    assert len(rows) == 4  # three chunks of the big one
    assert protocol.results_from_rows(list(reversed(rows))) == [small, big]


def test_a_fit_workers_public_fields_hold_its_kinds_output_and_a_run_workers_do_not():
    fitted = ProcessReport(timings={"training": 2.0}, python_prefix="/venv", output=FitOutput(steps=7, history={"loss": [1.0]}))
    result = WorkerResult(fitted, index=0, host="h", rows=10, written={"checksum": "abc", "validation_rows": 2},
                          agreed={"steps_per_epoch": 5}, timings={"training": 2.0, "rendezvous": 0.01})
    public = result.public()
    assert (public["steps"], public["rows"], public["shard_checksum"], public["validation_rows"]) == (7, 10, "abc", 2)
    assert public["steps_per_epoch"] == 5 and public["timings"] == {"training": 2.0, "rendezvous": 0.01}
    assert not {"output", "report", "history", "written", "agreed"} & set(public)
    ran = WorkerResult(ProcessReport(timings={}, python_prefix="/venv"), index=1, rows=0, written={"checksum": None})
    assert "steps" not in ran.public() and ran.public()["rows"] == 0


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
