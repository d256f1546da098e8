"""The faults of a real network, across hosts: Spark standalone workers in network namespaces of their
own on a bridge the test makes (support/hosts.py), a driver on the bridge's address.

One 2-host cluster and one driver program (support/host_faults_driver.py) go through every fault in
turn: worker 1's host's link cut mid-epoch, then the chief's; a fit once the link is back; worker 1's
host killed mid-fit without retries, then with max_retries and checkpoint_dir while a new worker starts
there; hosts that cannot reach the driver's link; one host's link shaped to 2 Mbit/s. The driver asks
for each fault through the cluster's Operator (a training process does, at a chosen step), and each
failed fit reports its error, the seconds from the fault to the error (which the tests bound), and the
training processes left on every host; the resumed fit, the steps each attempt ran (noted by a callback of
the test) and its weights beside the same fit's uninterrupted. bench/faults_bench.py times the same faults."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import run_driver, succeeded

from support import hosts
from support.hosts import HostsCluster, left_behind

AVAILABLE, WHY_NOT = hosts.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)
NOTHING_LEFT = {"namespaces": [], "links": [], "processes": [], "state": []}
SCENARIOS = ["cut_link", "cut_link_retried", "cut_chief_link", "fit_after_restore", "lost_host", "lost_host_resumes",
             "unreachable_link", "slow_link"]
# The most seconds from a fault to the error of the fit it failed: about twice the longest it took here (2 shared,
# loaded cores). A cut link took 10.7-12.4 s, or 21.8-22.3 s (the worker's host: 1 run of 11, the chief's: 4 of
# 11), to reach the worker that remained as an aborted collective and be blamed on the silent host by its probe of
# its peers (rendezvous.silent_peers, 2 s); a lost host 0.8-4.3 s. Before that probe a cut link took 54-71 s.
LOST_WITHIN = 45
# The most seconds that probe takes to find a cut host silent: 2.0 s (its timeout, settings.PEER_PROBE_TIMEOUT).
# With that timeout at 60 s it took 60 s here, and a cut link 30.5-49.1 s in a fit (6 runs; the probe's connection
# failed before the 60 s), which LOST_WITHIN does not always tell from a TensorFlow that was slow to abort.
PROBE_WITHIN = 5


def drive(cluster, scenarios):
    """Run support/host_faults_driver.py's ``scenarios`` against ``cluster``, its faults served by the
    cluster's Operator; the list of their outcomes."""
    shared = os.path.join(cluster.dir, "shared")
    requests = os.path.join(shared, "requests")
    os.makedirs(shared)
    config = {"url": cluster.url, "driver": cluster.driver_address, "dir": shared, "requests": requests,
              "hosts": [cluster.host_address(i) for i in range(cluster.hosts)],
              "namespaces": [cluster.namespace(i) for i in range(cluster.hosts)], "scenarios": scenarios}
    with cluster.serve(requests):
        return run_driver("host_faults_driver.py", json.dumps(config), timeout=900,
                          env=dict(os.environ, SPARK_LOCAL_IP=cluster.driver_address))


@pytest.fixture(scope="module")
def faults():
    """{scenario: its outcome} of one driver program over one 2-host cluster, and what the cluster left."""
    with HostsCluster(hosts=2) as cluster:
        outcomes = drive(cluster, SCENARIOS)
        run_id, addresses = cluster.run_id, [cluster.host_address(i) for i in range(cluster.hosts)]
    found = {o.get("scenario", f"#{i}"): o for i, o in enumerate(outcomes)}
    print("\n" + "\n".join(f"{name}: {o.get('seconds', '-')} s from the fault to the error, "
                           f"{o.get('scenario_seconds')} s in all" for name, o in found.items()))
    found["left"], found["hosts"] = left_behind(run_id), addresses
    return found



def no_job_process_left(outcome):
    """No training process of the failed job was left on any host (after at most 30 s)."""
    assert outcome["left"]["gone_after"] is not None, outcome["left"]
    assert not any(outcome["left"]["after"].values())


def lost_worker(outcome, worker, seen_by):
    """The failed fit raised a retryable WorkerLostError naming the faulted host and ``worker`` on it, less
    than LOST_WITHIN s after the fault; what the worker that remained (``seen_by``) saw is context, after the
    cause."""
    assert outcome["class"] == "WorkerLostError" and "WorkerError" in outcome["mro"], outcome["message"]
    assert outcome["seconds"] < LOST_WITHIN, f"{outcome['seconds']} s from the fault to the error"
    assert outcome["host"] == outcome["faulted_host"] and outcome["worker"] == worker
    assert outcome["retryable"] is True
    cause, _, context = outcome["message"].partition("--- what the workers that remained saw, as a consequence ---")
    assert cause.startswith(f"worker {worker} on {outcome['faulted_host']} was lost: ")
    assert not context or f"worker {seen_by} on " in context
    return cause, context


def test_a_cut_link_fails_the_fit_with_a_retryable_error_naming_the_host_that_stopped_answering(faults):
    outcome = faults["cut_link"]
    cause, context = lost_worker(outcome, worker=1, seen_by=0)
    assert "its host stopped answering" in cause
    # the healthy worker's aborted exchange (tfbarrier's ring: worker 1 went silent) is the context, not the cause
    assert "PeerLostError" in context and "worker 1 went silent in the ring" in context
    assert outcome["attempts"] == [{"attempt": 1, "error": "WorkerLostError: " + cause.splitlines()[0],
                                    "retryable": True}]
    no_job_process_left(outcome)


def test_a_link_that_stays_cut_ends_a_fit_with_retries_in_a_cluster_error_instead_of_a_hang(faults):
    # Spark counts the task on the cut host as running until its link is back (or spark.network.timeout):
    # a job submitted again would wait for its slot with no end.
    outcome = faults["cut_link_retried"]
    assert outcome["class"] == "ClusterError", outcome["message"]
    assert f"after losing {outcome['faulted_host']}" in outcome["message"]
    assert f"Spark still counts a task on {outcome['faulted_host']} as running" in outcome["message"]
    assert outcome["cause"]["class"] == "WorkerLostError" and outcome["cause"]["host"] == outcome["faulted_host"]
    # the lost worker found as fast as without retries, then the wait for a replacement (18.8-20.1 s in all)
    assert outcome["seconds"] < LOST_WITHIN + outcome["replacement_wait"], f"{outcome['seconds']} s from the cut"
    assert [a["error"].split(":")[0] for a in outcome["attempts"]] == ["WorkerLostError"]
    no_job_process_left(outcome)


def test_a_cut_link_of_the_chiefs_host_names_the_chiefs_host(faults):
    # The chief runs TensorFlow's coordination service: the worker that remained sees its heartbeats fail.
    outcome = faults["cut_chief_link"]
    cause, context = lost_worker(outcome, worker=0, seen_by=1)
    assert "its host stopped answering" in cause and context
    no_job_process_left(outcome)


def test_the_next_fit_succeeds_on_the_same_cluster_once_the_link_is_back(faults):
    after = succeeded(faults, "fit_after_restore")
    assert after["hosts"] == sorted(faults["hosts"]) and after["attempts"] == 1


def test_a_lost_host_without_retries_is_a_retryable_worker_lost_error_naming_it(faults):
    outcome = faults["lost_host"]
    cause, _ = lost_worker(outcome, worker=1, seen_by=0)
    # Spark says whichever of the host's processes the kill reached first: the executor, or the task's Python worker
    assert "Spark lost its executor" in cause or "Python worker exited unexpectedly" in cause
    no_job_process_left(outcome)
    assert outcome["executors_back"]  # the host's new worker gave the application an executor again


def test_a_lost_host_with_retries_resumes_from_the_checkpoint_each_epoch_once(faults):
    # 2 epochs of 10 steps, a save every 2 steps; host 1 is stopped once worker 0 is past epoch 1's step 3.
    resumed = succeeded(faults, "lost_host_resumes")
    first, second = resumed["attempts"]
    assert first["retryable"] and first["error"].startswith(f"WorkerLostError: worker 1 on {resumed['faulted_host']}")
    assert second["error"] is None and second["initial_epoch"] == 1
    # The steps each attempt ran, as a callback of the test noted them on every worker (its batch ends).
    ran = {(r["attempt"], r["worker"]): [tuple(step) for step in r["steps"]] for r in resumed["ran"]}
    before = ran[1, 0]  # the worker that remained
    last = len(before) - 11  # the last step of epoch 1 it finished
    assert before == [(0, step) for step in range(10)] + [(1, step) for step in range(last + 1)]
    assert last >= 3
    start = ran[2, 0][0][1]
    # the resumed attempt ran the rest of epoch 1 only, on the host that remained and the restarted one
    assert ran[2, 0] == ran[2, 1] == [(1, step) for step in range(start, 10)], ran
    # from the step after a save (10 + start steps done: a multiple of 2), at most 1 finished step again; 1 past
    # ``last`` when the save after the next step was whole but the fault came before any worker noted that step
    assert (10 + start) % 2 == 0 and last <= start <= last + 2, (last, start)
    assert second["resumed_at"]["step"] == start and resumed["steps"] == [10 - start] * 2  # tfbarrier's record agrees
    assert len(resumed["history"]["loss"]) == 2  # each epoch once
    # and it ended as the same fit uninterrupted did
    uninterrupted = resumed["uninterrupted"]
    for name, values in uninterrupted["history"].items():
        np.testing.assert_allclose(resumed["history"][name], values, rtol=1e-5, err_msg=name)
    for trained, expected in zip(resumed["weights"], uninterrupted["weights"], strict=True):
        np.testing.assert_allclose(trained, expected, rtol=1e-5, atol=1e-6)
    assert len(resumed["hosts"]) == 2 and resumed["faulted_host"] in resumed["hosts"]
    no_job_process_left(resumed)


def test_hosts_that_cannot_reach_the_driver_link_train_through_spark_with_a_warning(faults):
    unreachable = succeeded(faults, "unreachable_link")
    first, second = unreachable["attempts"]
    assert first["error"].startswith("DriverUnreachableError") and second["error"] is None
    # the files came inside the job, and no message ever reached the link: the tasks met through allGather
    assert unreachable["transfer_via"] == ["spark", "spark"] and unreachable["messages"] == 0
    assert len(unreachable["hosts"]) == 2
    assert unreachable["warnings"] and all(w.startswith("ProgressUnavailableWarning") for w in unreachable["warnings"])


def test_a_slow_link_slows_the_steps_but_no_stall_is_declared_while_they_advance(faults):
    slow, fast = succeeded(faults, "slow_link"), succeeded(faults, "fit_after_restore")
    # it completed, though it trained for much longer than its stall_timeout (5 s) without a stall
    assert slow["attempts"] == 1 and slow["hosts"] == sorted(faults["hosts"]) and slow["training_seconds"] > 2 * 5
    assert slow["seconds_per_step"] > 3 * fast["seconds_per_step"]  # the progress shows the slower link
    assert slow["progress_messages"] >= 5 and slow["longest_silence"] < 5


def test_the_faults_leave_no_namespace_link_or_process_behind(faults):
    assert faults["left"] == NOTHING_LEFT


# ---- how a worker tells a lost peer from a failed one ----------------------------------------------

_LISTEN = """
import socket, sys, time
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
time.sleep(600)
"""


def test_a_peer_whose_host_is_cut_is_silent_and_one_whose_process_is_gone_still_answers():
    from tfbarrier.spark import rendezvous

    with HostsCluster(hosts=2, spark=False) as cluster:
        server = cluster.popen(1, [sys.executable, "-c", _LISTEN, cluster.host_address(1)], stdout=subprocess.PIPE,
                               text=True)
        peers = [{"host": cluster.driver_address, "port": 1},  # this process is worker 0: never asked
                 {"host": cluster.host_address(1), "port": int(server.stdout.readline())}]
        listening = rendezvous.silent_peers(peers, 0)
        server.kill()
        server.wait()
        refusing = rendezvous.silent_peers(peers, 0)  # the host is up, nothing listens: a failed peer, not a lost one
        cluster.cut(1)
        started = time.monotonic()
        cut = rendezvous.silent_peers(peers, 0)
        waited = time.monotonic() - started
        run_id = cluster.run_id
    assert (listening, refusing, cut) == ([], [], [1])
    assert waited < PROBE_WITHIN, f"{waited:.1f} s to find the cut host silent"
    assert left_behind(run_id) == NOTHING_LEFT
