"""Warm start (spares.py): a task leaves a spare training process that has imported TensorFlow, the
next task on that executor trains in it, even after Spark retired the Python worker that left it, no
spare outlives its idle timeout or Spark, and no process of another local user takes one."""

import time

from conftest import run_driver, training_processes


def test_spares_outlive_python_workers_serve_the_next_fit_and_die_with_spark():
    report = run_driver("spares_fit.py")
    first, second, timed_out, off, last = report["fits"]
    # Another local user (nobody) found the keepers' sockets, got no spare, and planted no job (issue 58).
    intruder = report["intruder"]
    assert intruder.get("uid") == 65534 and intruder["sockets"] >= 2, intruder
    assert intruder["taken"] == 0 and not intruder["marker"], intruder
    assert intruder["spares_after"] == 2, intruder
    assert first["warm"] == [False, False]
    assert second["warm"] == [True, True]  # although the Python workers that left them are gone
    assert timed_out["warm"] == [True, True]
    assert len(timed_out["spares_seen"]) == 2 and timed_out["spares"] == []  # left with a 5 s idle timeout
    assert off["warm"] == [False, False]  # spark.tfbarrier.warmStart=false
    assert last["warm"] == [False, False]
    for fit in report["fits"]:
        assert fit["checksums"][0] == fit["checksums"][1]  # the replicas stayed in sync
        assert fit["busy"] == []  # every process that trained has exited
    assert len(first["spares"]) == 2  # one per task
    assert len(second["spares"]) == 2 and not set(second["spares"]) & set(first["spares"])  # used, replaced
    assert off["spares"] == [] and len(last["spares"]) == 2  # none left with warm start off
    assert len(report["keepers"]) == 2
    # A fresh process imports TensorFlow after its task sent the job; a spare had done it before.
    assert min(first["tensorflow_import"]) > max(second["tensorflow_import"])
    deadline = time.monotonic() + 30
    tag = report["tag"]
    while (training_processes(spares=True, tag=tag) or training_processes(tag=tag, module="tfbarrier.spark.spares")) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert training_processes(spares=True, tag=tag) == []
    assert training_processes(tag=tag, module="tfbarrier.spark.spares") == []
