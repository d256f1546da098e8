"""Warm start (spares.py, keeper.py): a task leaves a keeper that has imported TensorFlow, the next tasks
on that executor train in processes it forks, even after Spark retired the Python worker that left it,
no keeper outlives its idle timeout or Spark, and no process of another local user takes a process."""

import os
import pickle
import signal
import subprocess
import sys
import time

import psutil
from conftest import run_driver, training_processes

from tfbarrier.spark.launcher import importable_home


def test_keepers_outlive_python_workers_fork_the_next_fits_processes_and_die_with_spark():
    report = run_driver("spares_fit.py")
    first, second, timed_out, off, last, squatted = report["fits"]
    # Another local user (nobody) found the keeper's socket, got no process, and planted no job (issue 58).
    intruder = report["intruder"]
    assert intruder.get("uid") == 65534 and intruder["sockets"] >= 1, intruder
    assert intruder["taken"] == 0 and not intruder["marker"], intruder
    assert intruder["keepers_after"] == second["keepers"], intruder
    # A process of the same user that is no child of the executor got nothing either (the parent half of the check).
    stranger = report["same_user_intruder"]
    assert stranger.get("uid") == os.getuid() and stranger["sockets"] >= 1, stranger
    assert stranger["taken"] == 0 and not stranger["marker"], stranger
    assert stranger["keepers_after"] == second["keepers"], stranger
    assert first["warm"] == [False, False]
    assert second["warm"] == [True, True]  # although the Python workers that left the keeper are gone
    assert timed_out["warm"] == [False, False]  # a keeper serves the tasks of its own idle timeout
    assert off["warm"] == [False, False]  # spark.tfbarrier.warmStart=false
    assert last["warm"] == [True, True]
    for fit in report["fits"]:
        assert fit["checksums"][0] == fit["checksums"][1]  # the replicas stayed in sync
        assert fit["busy"] == [] and fit["idle_spares"] == []  # every process that trained has exited
    # One keeper for the executor's two tasks, serving fit after fit.
    assert len(first["keepers"]) == 1 and second["keepers"] == first["keepers"] == last["keepers"]
    # spareIdleTimeout=5 left a keeper of its own, gone 5 s after; warm start off left none.
    assert len(timed_out["keepers_seen"]) == 2 and timed_out["keepers"] == first["keepers"]
    assert off["keepers"] == first["keepers"]
    # Another local user took the keeper's name once it ended: both tasks came, saw a stranger and closed at once,
    # and trained in processes of their own (with the check of who listens gone, they waited on it for 20 s).
    squatter = report["squatter"]
    assert squatter.get("uid") == 65534 and len(squatter["connections"]) == 2, squatter
    assert all(c["closed_by_task"] and c["held"] < 5 for c in squatter["connections"]), squatter
    assert squatted["warm"] == [False, False]
    # A fresh process imports TensorFlow after its task sent the job; a keeper had done it before it forked.
    assert min(first["tensorflow_import"]) > 0 and max(second["tensorflow_import"]) == 0
    deadline = time.monotonic() + 30
    tag = report["tag"]
    while (training_processes(spares=True, tag=tag) or training_processes(tag=tag, kind="keeper")
           or training_processes(tag=tag, kind="relay")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert training_processes(spares=True, tag=tag) == []
    assert training_processes(tag=tag, kind="keeper") == [] and training_processes(tag=tag, kind="relay") == []


def _keeper(idle_timeout=120):
    """A keeper for this process's environment, owned by this test, as spares.leave starts one;
    (its Popen, its home)."""
    home, env = importable_home("tfbarrier-keeper-", dict(os.environ))
    spec = {"python": sys.executable, "env": dict(os.environ), "owner": os.getpid(), "idle_timeout": idle_timeout,
            "home": home}
    keeper = subprocess.Popen([sys.executable, "-m", "tfbarrier.spark.keeper"], stdin=subprocess.PIPE, env=env)
    keeper.stdin.write(pickle.dumps(spec))
    keeper.stdin.close()
    return keeper, home


TAKER = """
import os, sys, time
from tfbarrier.spark import spares
deadline = time.monotonic() + 60
while (handover := spares.request(sys.executable, dict(os.environ), 120)) is None and time.monotonic() < deadline:
    time.sleep(0.1)  # until the keeper listens
process = handover.receive()
print(process.pid, process.home, flush=True)
time.sleep(600)
"""


def test_a_keeper_stopped_twice_while_its_relay_stops_a_process_leaves_no_directory_behind():
    # Spark's daemon sends SIGHUP at shutdown, and a second signal could reach a keeper while its relay waited
    # for a training process to exit: that one cut the cleanup short, and CI's run left the processes' homes in /tmp.
    keeper, keeper_home = _keeper()
    # A child of the owner, in the environment the keeper matches (a library may have set more in C's own).
    taker = subprocess.Popen([sys.executable, "-c", TAKER], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        pid, home = taker.stdout.readline().split()
        process = psutil.Process(int(pid))
        assert os.path.basename(home).startswith("tfbarrier-process-") and os.path.isdir(home)
        (relay,) = psutil.Process(keeper.pid).children()
        deadline = time.monotonic() + 30
        while process.name() != "tfb-spare" and time.monotonic() < deadline:  # named at once after the fork
            time.sleep(0.05)
        assert process.ppid() == relay.pid and relay.name() == "tfb-relay" and process.name() == "tfb-spare"
        process.suspend()  # so that the relay's stop() waits its whole grace for it
        keeper.send_signal(signal.SIGHUP)
        time.sleep(1)
        keeper.send_signal(signal.SIGTERM)  # while that wait runs
        code = keeper.wait(60)
        assert not os.path.exists(home) and not os.path.exists(keeper_home)
        assert code == 128 + signal.SIGHUP  # the first signal's exit: the second was ignored
        assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
        assert not relay.is_running() or relay.status() == psutil.STATUS_ZOMBIE
    finally:
        taker.kill()
        keeper.kill()


IMPORTS_ADD = """
import os
before = set(os.environ)
import tensorflow, keras
print(*sorted(set(os.environ) - before))
"""


def test_a_fit_after_a_predict_in_the_same_python_workers_is_still_served_warm():
    # Predict imports TensorFlow in Spark's Python workers, which sets TF2_BEHAVIOR and the like in their
    # environment: the next fit's tasks asked for a keeper of another environment, and started cold.
    # The driver starts without what those imports add, as R's does (this process imported both).
    added = subprocess.run([sys.executable, "-c", IMPORTS_ADD], capture_output=True, text=True, timeout=120,
                           env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}).stdout.split()
    assert "TF2_BEHAVIOR" in added, added
    clean = {name: value for name, value in os.environ.items() if name not in added}
    report = run_driver("warm_after_predict.py", env=clean)
    assert report["scored"] == 1497
    assert report["warm"] == [[False, False], [True, True]]
    assert len(report["keepers"][0]) == 1 and report["keepers"][1] == report["keepers"][0]
