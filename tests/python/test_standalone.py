"""The same fit on a Spark standalone cluster: a master and two workers (one core each, so each
barrier task runs in its own executor JVM) started on 127.0.0.1 by the test and stopped after."""

import json
import os
import subprocess
import sys

import psutil
from standalone import StandaloneCluster

HERE = os.path.dirname(os.path.abspath(__file__))


def test_fit_on_a_standalone_cluster_with_two_executors():
    with StandaloneCluster(workers=2, cores=1) as cluster:
        out = subprocess.run([sys.executable, os.path.join(HERE, "standalone_fit.py"), cluster.url],
                             capture_output=True, text=True, timeout=420, cwd=HERE)
        assert out.returncode == 0, out.stderr[-4000:]
        cluster_pids = [proc.pid for _, proc in cluster.procs]
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["accuracy"] >= 0.90
    assert len(result["executors"]) == 3  # the driver and one executor per worker
    workers = result["workers"]
    assert [w["index"] for w in workers] == [0, 1] and all(w["rows"] > 0 for w in workers)
    assert workers[0]["checksum"] == workers[1]["checksum"]
    assert not [pid for pid in cluster_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
