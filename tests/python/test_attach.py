"""Attaching to a Spark driver JVM another process started (tfbarrier.attach, what R's face does with
sparklyr's): the stand-in owner (support/jvm_owner.py) starts Spark and Spark's Py4JServer; a driver
program of its own (support/attached_driver.py: this test session has a SparkContext already) attaches,
trains on the owner's view and scores into a view the owner reads. The owner's SparkContext runs on."""

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest
from conftest import left_behind
from support.standalone import StandaloneCluster

from tfbarrier.spark.attachment import check_versions
from tfbarrier.errors import ClusterError

HERE = os.path.dirname(os.path.abspath(__file__))


class Owner:
    """support/jvm_owner.py running: ``ready`` is its READY line, ``ask(command)`` its answer."""

    def __init__(self, master=None, python=sys.executable, jvm_library_path=None):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
        if jvm_library_path:
            env["TFBARRIER_TEST_JVM_LIBRARY_PATH"] = jvm_library_path
        self.proc = subprocess.Popen([python, os.path.join(HERE, "support", "jvm_owner.py"),
                                      *([master] if master else [])], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=HERE, env=env)
        self.ready = json.loads(self._line("READY "))

    def _line(self, prefix, seconds=120):
        deadline = time.monotonic() + seconds
        while select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"the owner exited with {self.proc.wait()} before printing {prefix!r}")
            if line.startswith(prefix):
                return line[len(prefix):]
        raise AssertionError(f"the owner printed no {prefix!r} within {seconds} s")

    def ask(self, **command):
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line("ANSWER "))

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(60)


def attached_run(owner, tmp_path, embedded):
    """Run support/attached_driver.py against ``owner`` (the secret goes on its stdin): (what it saw, what
    the owner read of its view ``scored`` while it waited; ``embedded``: while it was stopped, as an R
    session busy in sparklyr runs no Python)."""
    given = dict(owner.ready, ancestors_file=str(tmp_path / "ancestors.json"), embedded=embedded)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "support", "attached_driver.py")], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=HERE, env=env)
    proc.stdin.write(json.dumps(given) + "\n")
    proc.stdin.flush()
    scored = None
    for line in proc.stdout:
        if line.startswith("SCORED"):
            if embedded:
                proc.send_signal(signal.SIGSTOP)
            try:
                scored = owner.ask(view="scored")
            finally:
                proc.send_signal(signal.SIGCONT)
            proc.stdin.write("go on\n")
            proc.stdin.flush()
            break
    out, err = proc.communicate(timeout=600)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert scored and lines and proc.returncode == 0, err[-4000:]
    assert owner.ready["secret"] not in out + err  # no log line carries it
    return json.loads(lines[0][7:]), scored


def shadowing_library_dir(tmp_path):
    """A directory that holds a ``libpython`` of this interpreter's soname which is not its own: on a
    library path before the interpreter's own directory, the dynamic loader takes it. R puts the system's
    library directory there, which on Debian holds the system Python's (issue 57: a venv's Python 3.11.7
    then loaded Debian's 3.11.2 and failed on ``_ssl``); this one is an empty file, so that a Python that
    loads it cannot even start."""
    import sysconfig

    directory = tmp_path / "shadowing-lib"
    directory.mkdir()
    (directory / sysconfig.get_config_var("INSTSONAME")).write_bytes(b"")
    return str(directory)


# Locally, the JVM starts the Python workers: they inherit its LD_LIBRARY_PATH, here one whose first
# directory holds another libpython (as a JVM that R started has).
@pytest.mark.parametrize("where", [pytest.param("local", marks=pytest.mark.versions), "standalone"])
def test_an_attached_process_trains_and_scores_in_the_owners_application_and_leaves_it_running(where, tmp_path):
    cluster = StandaloneCluster(workers=2) if where == "standalone" else None
    try:
        if cluster:
            cluster.__enter__()
        owner = Owner(cluster.url if cluster else None,
                      jvm_library_path=None if cluster else shadowing_library_dir(tmp_path))
        try:
            seen, scored = attached_run(owner, tmp_path, embedded=where == "local")
            assert seen["app_id"] == owner.ready["app_id"]  # one application: the owner's
            assert seen["master"] == owner.ready["master"]
            assert not seen["secret_in_environ"]
            assert seen["fit"] == {"rows": owner.ask(view="digits")["rows"], "epochs": 2}
            # the attached process's predictions, read by the owner
            assert scored["rows"] == 300 and scored["columns"] == ["pixels", "digit", "prediction"]
            assert all(0 <= value <= 9 for value in scored["first"])
            assert seen["same_session_again"] and seen["after_stop"] and seen["reattached_rows"] > 0
            assert owner.ask(alive=True) == {"alive": True}  # stop() on the attached session only detached
            if cluster:  # the training processes ran under the owner application's executors
                assert any(f"--app-id {owner.ready['app_id']}" in line for line in seen["training_ancestors"])
        finally:
            owner.close()
    finally:
        if cluster:
            cluster.__exit__()
    assert left_behind() == []


def other_release_python():
    """An interpreter whose pyspark is of another release than this one's, from make's list (.venv's and
    the older releases' venvs of test-spark-versions)."""
    import pyspark

    mine = pyspark.__version__.split(".")[:2]
    for python in os.environ.get("TFBARRIER_SPARK_PYTHONS", "").split():
        version = subprocess.run([python, "-c", "import pyspark; print(pyspark.__version__)"], capture_output=True,
                                 text=True).stdout.strip()
        if version and version.split(".")[:2] != mine:
            return python, version
    pytest.fail("no Python with pyspark of another release in TFBARRIER_SPARK_PYTHONS: run through make test")


@pytest.mark.versions
def test_attaching_to_a_jvm_of_another_spark_release_is_refused_naming_both_before_any_job(tmp_path):
    import pyspark

    python, version = other_release_python()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    owner = Owner(python=python)
    try:
        code = ("import json, sys, tfbarrier\n"
                "given = json.loads(sys.stdin.readline())\n"
                "try:\n"
                "    tfbarrier.attach(given['port'], given['secret'], pin_thread=given['pin_thread'])\n"
                "except tfbarrier.errors.ClusterError as exc:\n"
                "    print('REFUSED ' + str(exc))\n")
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps(owner.ready) + "\n", capture_output=True,
                             text=True, timeout=300, env=env)
        refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED ")]
        assert refused, out.stderr[-3000:]
        assert f"runs Spark {version}" in refused[0] and f"has pyspark {pyspark.__version__}" in refused[0]
        assert owner.ready["secret"] not in out.stdout + out.stderr
        assert owner.ask(alive=True) == {"alive": True}
    finally:
        owner.close()


def test_a_pyspark_of_another_release_than_the_jvm_is_refused_with_both_versions_and_the_fix():
    check_versions("4.3.0", "4.3.1")  # patch releases speak the same protocol
    with pytest.raises(ClusterError, match=r"runs Spark 3\.5\.9, but this Python .* has pyspark 4\.3\.0.*"
                                           r"pyspark==3\.5\.\*.*spark_version = \"3\.5\""):
        check_versions("3.5.9", "4.3.0")
