"""Warm start (spares.py): a task leaves a spare training process that has imported TensorFlow, the
next task on that Spark Python worker trains in it, and no spare outlives Spark."""

import time

from conftest import run_driver, training_processes


def test_spares_serve_the_next_fit_and_die_with_spark():
    report = run_driver("spares_fit.py")
    first, second, off = report["fits"]
    assert first["warm"] == [False, False]
    assert second["warm"] == [True, True]
    assert off["warm"] == [False, False]  # spark.tfbarrier.warmStart=false
    for fit in report["fits"]:
        assert fit["checksums"][0] == fit["checksums"][1]  # the replicas stayed in sync
        assert fit["busy"] == []  # every process that trained has exited
    assert len(first["spares"]) == 2  # one per Python worker
    assert len(second["spares"]) == 2 and not set(second["spares"]) & set(first["spares"])  # used, replaced
    assert off["spares"] == second["spares"]  # none taken, none left
    # A fresh process imports TensorFlow after its task sent the job; a spare had done it before.
    assert min(first["tensorflow_import"]) > max(second["tensorflow_import"])
    deadline = time.monotonic() + 30
    while training_processes(spares=True, tag=report["tag"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert training_processes(spares=True, tag=report["tag"]) == []
