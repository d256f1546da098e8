"""Warm start (spares.py): a task leaves a spare training process that has imported TensorFlow, the
next task on that Spark Python worker trains in it, and no spare outlives Spark."""

import json
import os
import subprocess
import sys
import time

from conftest import training_processes

HERE = os.path.dirname(os.path.abspath(__file__))


def test_spares_serve_the_next_fit_and_die_with_spark():
    out = subprocess.run([sys.executable, os.path.join(HERE, "spares_fit.py")],
                         capture_output=True, text=True, timeout=420, cwd=HERE)
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
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
