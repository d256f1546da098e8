"""The same fit on a Spark standalone cluster: a master and two workers (one core each, so each
barrier task runs in its own executor JVM) started on 127.0.0.1 by the test and stopped after."""

import psutil
from conftest import run_driver
from support.standalone import StandaloneCluster


def test_fit_on_a_standalone_cluster_with_two_executors():
    with StandaloneCluster(workers=2, cores=1) as cluster:
        result = run_driver("standalone_fit.py", cluster.url)
        cluster_pids = [proc.pid for _, proc in cluster.procs]
    assert result["accuracy"] >= 0.90
    assert len(result["executors"]) == 3  # the driver and one executor per worker
    workers = result["workers"]
    assert [w["index"] for w in workers] == [0, 1] and all(w["rows"] > 0 for w in workers)
    assert workers[0]["checksum"] == workers[1]["checksum"]
    assert not [pid for pid in cluster_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
