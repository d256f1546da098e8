"""A Spark standalone cluster on 127.0.0.1 (one master, N workers) started from the pip pyspark
package, for tests: ``with StandaloneCluster(workers=2) as cluster: cluster.url``.

Where the master and each worker run is a hook (``master_host``, ``_worker_host``, ``_work_dir``,
``_launcher``, ``_env``): support/hosts.py runs each worker in a network namespace of its own."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pyspark


def _free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class StandaloneCluster:
    master_host = "127.0.0.1"
    dir_prefix = "tfbarrier-standalone-"  # of the cluster's directory (logs, work directories)

    def __init__(self, workers=2, cores=1, memory="2g", timeout=90):
        self.workers, self.cores, self.memory, self.timeout = workers, cores, memory, timeout
        self.home = os.path.dirname(pyspark.__file__)
        self.dir = tempfile.mkdtemp(prefix=self.dir_prefix)
        self.procs = []
        self.url = None

    def _env(self, worker=None):
        """The environment of the master (``worker`` None) or of worker ``worker`` and its executors."""
        return dict(os.environ, SPARK_HOME=self.home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                    SPARK_LOG_DIR=self.dir, SPARK_WORKER_DIR=os.path.join(self.dir, "work"))

    def _worker_host(self, worker):
        return "127.0.0.1"

    def _work_dir(self, worker):
        return os.path.join(self.dir, f"worker{worker}")

    def _launcher(self, worker):
        """What a worker's command runs under (e.g. ``ip netns exec NAME``): nothing here."""
        return []

    def _start(self, name, *args, env=None, launcher=()):
        log = open(os.path.join(self.dir, f"{name}.log"), "wb")
        command = [*launcher, os.path.join(self.home, "bin", "spark-class"), *args]
        proc = subprocess.Popen(command, env=env or self._env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def _wait_for(self, name, pattern):
        deadline = time.monotonic() + self.timeout
        path = os.path.join(self.dir, f"{name}.log")
        while time.monotonic() < deadline:
            with open(path, errors="replace") as f:
                if re.search(pattern, f.read()):
                    return
            time.sleep(0.3)
        raise TimeoutError(f"{name} did not log {pattern!r} within {self.timeout} s; see {path}")

    def _start_spark(self):
        """The master, then every worker at once, and wait until each registered."""
        port = _free_port(self.master_host)
        self.url = f"spark://{self.master_host}:{port}"
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", self.master_host,
                    "--port", str(port), "--webui-port", str(_free_port(self.master_host)))
        self._wait_for("master", "I have been elected leader")
        for i in range(self.workers):
            self._start_worker(i)
        for i in range(self.workers):
            self._wait_for(f"worker{i}", "Successfully registered with master")

    def _start_worker(self, i):
        """Start worker ``i`` (its log: ``worker<i>.log``), without waiting for it to register."""
        return self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host",
                           self._worker_host(i), "--cores", str(self.cores), "--memory", self.memory, "--webui-port",
                           str(_free_port()), "--work-dir", self._work_dir(i), env=self._env(i),
                           launcher=self._launcher(i))

    def _stop_spark(self):
        """SIGTERM to every process group started (workers first), SIGKILL to those still there after 20 s."""
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for _, proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()

    def __enter__(self):
        try:
            self._start_spark()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        self._stop_spark()
        shutil.rmtree(self.dir, ignore_errors=True)
