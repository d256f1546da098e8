"""tfbarrier across hosts: Spark standalone workers in network namespaces of their own, each with its
own address on a bridge the test makes (support/hosts.py), and a driver on the bridge's address.

One 2-host cluster and one driver program run every 2-host scenario (fit with validation_data, save_to
and checkpoint_dir; a second fit, warm; predict; run; apply; tune; a PythonEnv; a stranger on the bridge
during fits, issue 44; host 1 an impostor, support/impostor), then one 3-host cluster one fit. The cluster's own controls (shape, cut, stop_host) and its cleanup (on exit, SIGTERM, SIGINT,
and the sweep after a SIGKILL) are tested on their own, mostly without Spark."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import SESSION_TAG, run_driver, succeeded

from support import hosts
from support.hosts import HostsCluster, left_behind

AVAILABLE, WHY_NOT = hosts.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT)
HERE = os.path.dirname(os.path.abspath(__file__))
IMPOSTOR = os.path.join(HERE, "support", "impostor")  # its sitecustomize, first on host 1's Python path
STRANGER_SECRET = "the executor's secrets"
NOTHING_LEFT = {"namespaces": [], "links": [], "processes": [], "state": []}


def drive(cluster, scenarios, **extra):
    """Run support/hosts_driver.py's ``scenarios`` against ``cluster`` from a driver on the bridge."""
    shared = os.path.join(cluster.dir, "shared")
    os.makedirs(shared)
    config = {"url": cluster.url, "driver": cluster.driver_address, "dir": shared, "scenarios": scenarios,
              "tag": SESSION_TAG, "run_id": cluster.run_id,
              "hosts": [cluster.host_address(i) for i in range(cluster.hosts)],
              "namespaces": [cluster.namespace(i) for i in range(cluster.hosts)],
              "host_tmp": [os.path.join(cluster.host_dir(i), "tmp") for i in range(cluster.hosts)], **extra}
    return run_driver("hosts_driver.py", json.dumps(config), timeout=900,
                      env=dict(os.environ, SPARK_LOCAL_IP=cluster.driver_address))


class Clock:
    """Seconds per phase of a cluster's life: ``clock.mark("phase")`` ends the phase going on."""

    def __init__(self):
        self.last, self.seconds = time.monotonic(), {}

    def mark(self, phase):
        now = time.monotonic()
        self.seconds[phase], self.last = round(now - self.last, 1), now


def addresses(cluster):
    return {"driver": cluster.driver_address, "hosts": [cluster.host_address(i) for i in range(cluster.hosts)]}


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """The 2-host driver program's outcomes; then host 1 stopped (``stop_host``), and what the cluster
    left once it was gone."""
    loads = str(tmp_path_factory.mktemp("model-loads"))
    model_loads = [os.path.join(loads, f"host{i}.log") for i in range(2)]
    impostor = os.path.join(loads, "impostor")  # host 1 is an impostor while this file exists

    def env(i):
        if i == 0:
            return {"TFBARRIER_MODEL_LOAD_LOG": model_loads[i]}
        return {"TFBARRIER_MODEL_LOAD_LOG": model_loads[i], "TFBARRIER_TEST_IMPOSTOR": impostor,
                "PYTHONPATH": os.pathsep.join(p for p in (IMPOSTOR, os.environ.get("PYTHONPATH")) if p)}

    clock = Clock()
    with HostsCluster(hosts=2, env=env) as cluster:
        clock.mark("cluster start")
        outcome = drive(cluster, "two", model_loads=model_loads, impostor=impostor, stranger_secret=STRANGER_SECRET)
        clock.mark("driver program")
        spark = {name: proc.pid for name, proc in cluster.procs}
        before = {i: cluster.pids(i) for i in range(2)}
        stopped = cluster.stop_host(1)
        outcome["stop_host"] = {"before": before, "stopped": stopped, "after": {i: cluster.pids(i) for i in range(2)},
                                "spark": spark, "worker1_exit": dict(cluster.procs)["worker1"].wait(10)}
        outcome["addresses"], outcome["names"], run_id = addresses(cluster), cluster.names(), cluster.run_id
    clock.mark("stop_host and cluster exit")
    outcome["left"] = left_behind(run_id)
    outcome["spark_pids_alive"] = [pid for pid in spark.values() if not hosts.gone(pid)]
    print(f"\n2 hosts: {clock.seconds}; the driver's scenarios: {outcome['seconds']}")
    return outcome



def test_each_executor_runs_on_its_own_hosts_address(two_hosts):
    assert two_hosts["executors"] == sorted(two_hosts["addresses"]["hosts"])


def test_a_fit_across_two_hosts_keeps_replicas_equal_each_worker_reporting_its_hosts_address(two_hosts):
    fit = succeeded(two_hosts, "fit_with_validation_saving_and_checkpoints")
    workers = fit["workers"]
    assert sorted(w["host"] for w in workers) == sorted(two_hosts["addresses"]["hosts"])
    assert all(w["executor"].rsplit(":", 1)[0] == w["host"] for w in workers)
    assert workers[0]["checksum"] == workers[1]["checksum"]
    assert fit["attempts"] == 1
    # the tasks met through the driver's link on the bridge, and fetched the model's files over it
    assert len(fit["rendezvous"]) == 2 and all("through driver" in event for event in fit["rendezvous"])
    assert all(w["transfer"]["via"] == "driver link" for w in workers)
    assert fit["accuracy"] > 0.5  # 10 classes: trained, not guessing


def test_validation_save_to_and_checkpoint_dir_work_on_a_directory_every_host_sees(two_hosts):
    fit = succeeded(two_hosts, "fit_with_validation_saving_and_checkpoints")
    assert len(fit["history"]["val_loss"]) == 2 and None not in fit["history"]["val_loss"]
    assert sum(w["validation_rows"] for w in fit["workers"]) == 300  # every held-out row, once
    assert [s["epoch"] for s in fit["saved"]] == [1, 2] and all(s["bytes"] > 0 for s in fit["saved"])
    saves = [w["checkpoint_saves"] for w in fit["workers"]]
    assert saves[0] == saves[1] >= 2  # both hosts took part in each epoch's save
    assert "state" not in fit["checkpoint_files"]  # a finished fit leaves nothing to resume


def test_a_second_fit_starts_warm_on_both_hosts(two_hosts):
    second = succeeded(two_hosts, "second_fit")
    assert second["keepers_before"]
    assert [w["warm_start"] for w in second["workers"]] == [True, True]
    assert sorted(w["host"] for w in second["workers"]) == sorted(two_hosts["addresses"]["hosts"])
    assert second["workers"][0]["checksum"] == second["workers"][1]["checksum"]


def test_predict_scores_on_both_hosts_as_the_local_model_does(two_hosts):
    predicted = succeeded(two_hosts, "predict")
    assert predicted["rows"] == predicted["equal_to_local"] == 300
    assert all(loads >= 1 for loads in predicted["model_loads"])  # each host's executor loaded the model


def test_run_all_reduces_across_two_hosts(two_hosts):
    value = succeeded(two_hosts, "run")
    assert value["sum"] == 3.0  # 1 + 2: both workers' values, reduced over the hosts' link
    assert sorted(w.rsplit(":", 1)[0] for w in value["workers"]) == sorted(two_hosts["addresses"]["hosts"])


def test_apply_runs_one_partition_on_each_host(two_hosts):
    out = succeeded(two_hosts, "apply")
    assert out["partition"] == [0, 1] and sum(out["rows"]) == 1497
    assert sorted(a.rsplit(":", 1)[0] for a in out["address"]) == sorted(two_hosts["addresses"]["hosts"])
    assert all(set(w.split(",")) == set(out["address"]) for w in out["workers"])


def test_tune_runs_its_two_one_worker_trials_at_once_on_different_hosts(two_hosts):
    search = succeeded(two_hosts, "tune")
    assert search["status"] == ["ok", "ok"], search["errors"]
    assert sorted(h.rsplit(":", 1)[0] for h in search["hosts"]) == sorted(two_hosts["addresses"]["hosts"])


def test_a_python_env_is_built_once_per_host_then_reused(two_hosts):
    env = succeeded(two_hosts, "python_env")
    first, second = env["fits"]
    assert env["builds"] == [1, 1]  # one build in each host's own temporary directory, none after
    assert [w["environment"]["built"] for w in first] == [True, True]
    assert [w["environment"]["built"] for w in second] == [False, False]
    assert len({w["python_prefix"] for w in first}) == 2  # two hosts, two copies
    assert {w["python_prefix"] for w in second} == {w["python_prefix"] for w in first}


def test_a_stranger_on_the_bridge_gets_nothing_run_by_a_fit_over_the_ring_across_hosts(two_hosts):
    found = succeeded(two_hosts, "strangers")
    ring, strategy = found["ring"], found["strategy"]
    # the same stranger reads the file through the strategy's servers: it finds what it looks for
    assert sorted(strategy["ports"]) == sorted(two_hosts["addresses"]["hosts"]) and all(strategy["ports"].values())
    assert any(f"READ {STRANGER_SECRET}" in answer for answer in strategy["answers"]), strategy["answers"]
    # over the ring, the training processes on both hosts listen on nothing while they train
    assert ring["ports"] == {host: [] for host in two_hosts["addresses"]["hosts"]}, ring["ports"]
    assert not any("READ" in answer for answer in ring["answers"])
    for fit in (ring, strategy):  # the stranger came while they trained, and they went on unharmed
        assert fit["alive_after"] and fit["steps"] == [5, 5]
        assert fit["checksums"][0] == fit["checksums"][1]


def test_a_fit_whose_peers_cannot_authenticate_each_other_fails_naming_the_cause_without_hanging(two_hosts):
    failed = two_hosts["impostor"]
    assert failed["class"] == "WorkerError", failed
    # either worker's side: its peer did not prove the job's secret, or refused this one's proof of it
    assert "job's secret" in failed["message"] and "are both of this job?" in failed["message"], failed
    assert failed["seconds"] < 120, failed  # not the ring's wait (stall_timeout, 300 s) for a peer that proves it
    assert failed["left"] == [], failed


def test_stop_host_kills_every_process_of_that_host_and_none_of_the_others(two_hosts):
    stop = two_hosts["stop_host"]
    assert stop["spark"]["worker1"] in stop["before"][1] and stop["spark"]["worker1"] in stop["stopped"]
    assert stop["after"][1] == [] and stop["worker1_exit"] == -signal.SIGKILL
    assert stop["spark"]["worker0"] in stop["after"][0]  # host 0 goes on


def test_the_cluster_leaves_no_namespace_link_process_or_state_behind(two_hosts):
    assert two_hosts["names"]["namespaces"] and two_hosts["names"]["links"]  # there were some
    assert two_hosts["left"] == NOTHING_LEFT
    assert two_hosts["spark_pids_alive"] == []


def test_a_fit_across_three_hosts_keeps_replicas_equal_on_three_addresses():
    clock = Clock()
    with HostsCluster(hosts=3) as cluster:
        clock.mark("cluster start")
        outcome = drive(cluster, "three")
        clock.mark("driver program")
        expected, run_id = addresses(cluster)["hosts"], cluster.run_id
    clock.mark("cluster exit")
    print(f"\n3 hosts: {clock.seconds}; the driver's scenarios: {outcome['seconds']}")
    assert outcome["executors"] == sorted(expected)
    fit = succeeded(outcome, "three_hosts")
    assert sorted(w["host"] for w in fit["workers"]) == sorted(expected)
    assert len({w["checksum"] for w in fit["workers"]}) == 1
    assert sum(w["rows"] for w in fit["workers"]) == 1497
    assert left_behind(run_id) == NOTHING_LEFT


# ---- the cluster's controls and cleanup ------------------------------------------------------------

_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
"""


def connect(cluster, source, target, port, timeout=2.0):
    """What a TCP connect from host ``source`` to host ``target``:``port`` ends in."""
    out = subprocess.run(["ip", "netns", "exec", cluster.namespace(source), sys.executable, "-c", _CONNECT,
                          cluster.host_address(target), str(port), str(timeout)], capture_output=True, text=True)
    return out.stdout.strip()


def test_two_clusters_at_once_get_their_own_names_and_subnets():
    with HostsCluster(hosts=1, spark=False) as one, HostsCluster(hosts=1, spark=False) as other:
        assert one.run_id != other.run_id and one.subnet != other.subnet
        assert set(one.names()["links"]).isdisjoint(other.names()["links"])
        assert len(one.names()["namespaces"]) == len(other.names()["namespaces"]) == 1
        ids = one.run_id, other.run_id
    assert [left_behind(run_id) for run_id in ids] == [NOTHING_LEFT] * 2


def test_shape_limits_a_tcp_stream_between_hosts_to_the_rate_and_none_lifts_it():
    with HostsCluster(hosts=2, spark=False, rate="100mbit") as cluster:
        shaped = hosts.transfer_rate(cluster, 0, 1, 12 * 2**20)
        cluster.shape(0, None)
        cluster.shape(1, None)
        free = hosts.transfer_rate(cluster, 0, 1, 48 * 2**20)
    print(f"\ntbf 100mbit: {shaped / 1e6:.1f} Mbit/s; unshaped: {free / 1e6:.0f} Mbit/s")
    assert 80e6 < shaped <= 101e6
    assert free > 3 * shaped


def test_cut_makes_a_host_unreachable_until_restore():
    with HostsCluster(hosts=2, spark=False) as cluster:
        server = cluster.popen(1, [sys.executable, "-c", "import socket, sys, time\n"
                                   "s = socket.create_server((sys.argv[1], 0)); print(s.getsockname()[1], flush=True)\n"
                                   "time.sleep(600)", cluster.host_address(1)], stdout=subprocess.PIPE, text=True)
        port = int(server.stdout.readline())
        before = connect(cluster, 0, 1, port)
        cluster.cut(1)
        during = connect(cluster, 0, 1, port)
        cluster.restore(1)
        after = connect(cluster, 0, 1, port, timeout=10)
    assert (before, after) == ("connected", "connected")
    assert during in ("TimeoutError", "OSError")  # no answer, or no route: never a connection


def hold(*args):
    """A process holding a cluster (support/hosts.py ``hold``), and the JSON it printed once made. SIGINT is
    restored to its default first: a suite started in the background of a shell without job control
    inherits it ignored, and Python then never raises KeyboardInterrupt (the SIGINT case waited out 60 s)."""
    proc = subprocess.Popen([sys.executable, "-m", "support.hosts", "hold", *args], cwd=HERE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=HERE),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return proc, json.loads(line)


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_creating_process_stopped_by_a_signal_removes_everything(number):
    proc, made = hold("2")
    run_id = made["run_id"]
    before = left_behind(run_id)
    proc.send_signal(number)
    proc.wait(60)
    assert len(before["namespaces"]) == 2 and made["sleeper"] in before["processes"]
    assert left_behind(run_id) == NOTHING_LEFT
    assert not os.path.exists(made["dir"])


def test_sweep_removes_what_a_run_killed_by_sigkill_left_behind():
    proc, made = hold("1", "spark")
    run_id = made["run_id"]
    proc.kill()
    proc.wait()
    left = left_behind(run_id)
    assert left["namespaces"] and left["links"] and left["state"]
    assert len(left["processes"]) >= 3  # the master, the worker and a process on the host were orphaned
    assert run_id in hosts.sweep()
    assert left_behind(run_id) == NOTHING_LEFT
    assert not os.path.exists(made["dir"])
