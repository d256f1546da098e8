"""A Spark standalone cluster on 127.0.0.1 (one master, N workers) started from the pip pyspark
package, for tests: ``with StandaloneCluster(workers=2) as cluster: cluster.url``."""

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


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandaloneCluster:
    def __init__(self, workers=2, cores=1, memory="2g", timeout=90):
        self.workers, self.cores, self.memory, self.timeout = workers, cores, memory, timeout
        self.home = os.path.dirname(pyspark.__file__)
        self.dir = tempfile.mkdtemp(prefix="tfbarrier-standalone-")
        self.procs = []
        self.url = None

    def _env(self):
        env = dict(os.environ, SPARK_HOME=self.home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                   SPARK_LOG_DIR=self.dir, SPARK_WORKER_DIR=os.path.join(self.dir, "work"))
        return env

    def _start(self, name, *args):
        log = open(os.path.join(self.dir, f"{name}.log"), "wb")
        proc = subprocess.Popen([os.path.join(self.home, "bin", "spark-class"), *args], env=self._env(),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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

    def __enter__(self):
        port = _free_port()
        self.url = f"spark://127.0.0.1:{port}"
        try:
            self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", str(port), "--webui-port", str(_free_port()))
            self._wait_for("master", "I have been elected leader")
            for i in range(self.workers):
                name = f"worker{i}"
                self._start(name, "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                            "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(_free_port()),
                            "--work-dir", os.path.join(self.dir, name))
                self._wait_for(name, "Successfully registered with master")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
