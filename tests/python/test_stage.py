"""The driver's side of the barrier stage: results reassembled from chunks."""

import pickle

from tfbarrier import stage, task


def test_results_come_back_whole_from_chunks_in_worker_order():
    big = {"index": 1, "weights": b"x" * (2 * task.CHUNK + 123)}
    small = {"index": 0, "weights": b"y"}
    rows = []
    for result in (big, small):
        payload = pickle.dumps(result)
        for number, start in enumerate(range(0, len(payload), task.CHUNK)):
            rows.append({"index": result["index"], "chunk": number, "payload": payload[start:start + task.CHUNK]})
    assert len(rows) == 4
    assert stage._results(list(reversed(rows))) == [small, big]
