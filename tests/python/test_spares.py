"""Warm start (spares.py): a task leaves a spare training process that has imported TensorFlow, the
next task on that executor trains in it, even after Spark retired the Python worker that left it, no
spare outlives its idle timeout or Spark, and no process of another local user takes one."""

import os
import pickle
import signal
import subprocess
import sys
import time

import psutil
from conftest import run_driver, training_processes

from tfbarrier.spark.launcher import importable_home


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


def _keeper(idle_timeout=120):
    """A spare's keeper for this process's environment, owned by this test, as spares.leave starts one;
    (its Popen, its home)."""
    home, env = importable_home("tfbarrier-keeper-", dict(os.environ))
    spec = {"python": sys.executable, "env": dict(os.environ), "owner": os.getpid(), "idle_timeout": idle_timeout,
            "home": home}
    keeper = subprocess.Popen([sys.executable, "-m", "tfbarrier.spark.spares"], stdin=subprocess.PIPE, env=env)
    keeper.stdin.write(pickle.dumps(spec))
    keeper.stdin.close()
    return keeper, home


def test_a_keeper_stopped_twice_while_stopping_its_process_leaves_no_directory_behind():
    # Spark's daemon sends SIGHUP at shutdown, and a second signal could reach a keeper while it waited for its
    # training process to exit: that one cut the cleanup short, and CI's run left the processes' homes in /tmp.
    keeper, keeper_home = _keeper()
    try:
        deadline = time.monotonic() + 60
        while not (children := psutil.Process(keeper.pid).children()):
            assert keeper.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        process = children[0]
        home = process.environ()["PYTHONPATH"].split(os.pathsep)[0]
        assert os.path.basename(home).startswith("tfbarrier-process-")
        time.sleep(0.5)  # the keeper is in its `with TrainingProcess` block now
        process.suspend()  # so that the keeper's stop() waits its whole grace for it
        keeper.send_signal(signal.SIGHUP)
        time.sleep(1)
        keeper.send_signal(signal.SIGTERM)  # while that wait runs
        code = keeper.wait(60)
        assert not os.path.exists(home) and not os.path.exists(keeper_home)
        assert code == 128 + signal.SIGHUP  # the first signal's exit: the second was ignored
        assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    finally:
        keeper.kill()
