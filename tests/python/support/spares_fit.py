"""Driver program for test_spares: fits on a local[2] Spark of its own (so that its tasks are the only
ones) whose Python workers exit after each task (spark.python.worker.reuse=false), as when Spark
retires idle ones: keepers must outlive them. Prints one JSON line."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from conftest import SESSION_TAG, digits_cnn, digits_frames, make_spark, training_processes

import tfbarrier

spark = make_spark("local[2]", **{"spark.python.worker.reuse": "false"})
df = spark.createDataFrame(digits_frames()[0]).repartition(2).cache()
df.count()
report = {"tag": SESSION_TAG, "fits": []}


def keepers():
    return sorted(training_processes(kind="keeper"))


def wait_for(condition, seconds=60):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def fit(keeping=1, idle_out=False):
    """A fit, then the keepers awaited: ``keeping`` of them (a task starts one after it ends; both tasks of the
    executor do, and the one that finds the socket taken exits at once, so the count settles), and with
    ``idle_out`` until only those the fit found are left. With ``keeping=0``, a second for any to appear."""
    before = keepers()
    result = tfbarrier.fit(df, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64)
    if keeping:
        wait_for(lambda: len(keepers()) == keeping)
    else:
        time.sleep(1)
    seen = keepers()
    if idle_out:
        wait_for(lambda: keepers() == before)
    report["fits"].append({
        "warm": [w["warm_start"] for w in result.workers],
        "checksums": [w["checksum"] for w in result.workers],
        "tensorflow_import": [w["timings"]["tensorflow_import"] for w in result.workers],
        "keepers_seen": seen,
        "keepers": keepers(),
        "busy": training_processes(),
        "idle_spares": training_processes(spares=True),
    })


def intrude(same_user=False):
    """Another local user (support/intruder.py, as nobody), or with ``same_user`` a process of this user that is
    no child of the executor, tries to take the spares the last fit left and make them load a job it planted;
    the next fit must still find them."""
    marker = os.path.join(tempfile.mkdtemp(), "planted-job-loaded")
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, os.path.join(here, "intruder.py"), marker]
                         + (["--same-user"] if same_user else []), capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    seen = json.loads(lines[0][7:]) if lines else {"error": out.stderr[-2000:]}
    time.sleep(3)  # a spare that took the job would have unpickled it by now
    return dict(seen, marker=os.path.exists(marker), keepers_after=keepers())


def keeper_name(pid):
    """The abstract socket name the keeper ``pid`` listens on (from /proc/net/unix, by its descriptors' inodes)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    names = {row[-1] for row in rows if len(row) > 7 and row[6] in inodes and row[-1].startswith("@tfbarrier-spares-")}
    assert len(names) == 1, names
    return "\0" + names.pop()[1:]


def squat():
    """Another local user (support/squatter.py, as nobody) takes the name the keeper listened on once it has ended;
    a fit must start its own processes (cold) and close on the squatter at once, and leave no keeper behind it."""
    (keeper,) = keepers()
    name = keeper_name(keeper)
    os.kill(keeper, signal.SIGTERM)
    wait_for(lambda: not keepers())
    here = os.path.dirname(os.path.abspath(__file__))
    squatter = subprocess.Popen([sys.executable, os.path.join(here, "squatter.py"), name.encode().hex()],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert squatter.stdout.readline().strip() == "LISTENING"
    fit(keeping=0)
    out, _ = squatter.communicate("", timeout=120)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[0][7:]) if lines else {"error": out[-2000:]}


fit()
fit()
report["intruder"] = intrude()
report["same_user_intruder"] = intrude(same_user=True)
spark.conf.set("spark.tfbarrier.spareIdleTimeout", "5")
fit(keeping=2, idle_out=True)  # cold (no keeper of that timeout yet); leaves one, which gives up after 5 s
spark.conf.unset("spark.tfbarrier.spareIdleTimeout")
spark.conf.set("spark.tfbarrier.warmStart", "false")
fit(keeping=0)
spark.conf.unset("spark.tfbarrier.warmStart")
fit()  # the first keeper's again
report["squatter"] = squat()
print("RESULT " + json.dumps(report), flush=True)
spark.stop()
