"""Driver program for test_spares: fits on a local[2] Spark of its own (so that its tasks are the only
ones) whose Python workers exit after each task (spark.python.worker.reuse=false), as when Spark
retires idle ones: spares must outlive them. Prints one JSON line."""

import json
import os
import subprocess
import sys
import tempfile
import time

import psutil
from conftest import SESSION_TAG, digits_cnn, digits_frames, make_spark, training_processes

import tfbarrier

spark = make_spark("local[2]", **{"spark.python.worker.reuse": "false"})
df = spark.createDataFrame(digits_frames()[0]).repartition(2).cache()
df.count()
report = {"tag": SESSION_TAG, "fits": []}


def idle_spares():
    return sorted(set(training_processes(spares=True)) - set(training_processes()))


def ready_spares():
    """Idle spares that have imported TensorFlow (training_process.py renames itself then)."""
    return [pid for pid in idle_spares() if _name(pid) == "tfb-spare"]


def _name(pid):
    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return None


def wait_for(condition, seconds=60):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def fit(spares=2, idle_out=False):
    """A fit, then its ``spares`` idle spares awaited (their keepers start them after the tasks end) and,
    with ``idle_out``, awaited until they are gone. With ``spares=0``, a second for any to appear."""
    result = tfbarrier.fit(df, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64)
    if idle_out:  # a spare may time out before it has imported TensorFlow
        wait_for(lambda: len(idle_spares()) >= spares)
    elif spares:  # ready ones: a fit that adopts a spare still importing TensorFlow waits for it
        wait_for(lambda: len(ready_spares()) >= spares)
    else:
        time.sleep(1)
    seen = idle_spares()
    if idle_out:
        wait_for(lambda: not idle_spares())
    report["fits"].append({
        "warm": [w["warm_start"] for w in result.workers],
        "checksums": [w["checksum"] for w in result.workers],
        "tensorflow_import": [w["timings"]["tensorflow_import"] for w in result.workers],
        "spares_seen": seen,
        "spares": idle_spares(),
        "busy": training_processes(),
    })


def intrude():
    """Another local user (support/intruder.py, as nobody) tries to take the spares the last fit left and
    make them load a job it planted; the next fit must still find them."""
    marker = os.path.join(tempfile.mkdtemp(), "planted-job-loaded")
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, os.path.join(here, "intruder.py"), marker], capture_output=True,
                         text=True, timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    seen = json.loads(lines[0][7:]) if lines else {"error": out.stderr[-2000:]}
    time.sleep(3)  # a spare that took the job would have unpickled it by now
    return dict(seen, marker=os.path.exists(marker), spares_after=len(ready_spares()))


fit()
fit()
report["intruder"] = intrude()
spark.conf.set("spark.tfbarrier.spareIdleTimeout", "5")
fit(idle_out=True)  # leaves spares that give up after 5 s (2 s: a loaded machine could miss them in between)
spark.conf.unset("spark.tfbarrier.spareIdleTimeout")
spark.conf.set("spark.tfbarrier.warmStart", "false")
fit(spares=0)
spark.conf.unset("spark.tfbarrier.warmStart")
fit()  # leaves spares for spark.stop() to end
report["keepers"] = training_processes(spares=True, module="tfbarrier.spark.spares")
print("RESULT " + json.dumps(report), flush=True)
spark.stop()
