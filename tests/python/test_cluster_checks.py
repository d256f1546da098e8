"""Cluster settings a barrier stage cannot live with are refused on the driver, before any job.
Each case runs a driver of its own (these are settings a session starts with)."""

import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = """
import sys
from conftest import digits_cnn, make_spark
import pandas as pd
import tfbarrier
spark = make_spark("local[2]", **{%(conf)s})
df = spark.createDataFrame(pd.DataFrame({"pixels": [[0.0] * 64] * 4, "digit": [0, 1, 2, 3]}))
jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))
try:
    tfbarrier.fit(df, digits_cnn(), features="pixels", label="digit", batch_size=2, num_workers=2, %(extra)s)
    print("OUTCOME fitted")
except tfbarrier.errors.TfBarrierError as e:
    jobs_after = len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))
    print("OUTCOME", type(e).__name__, jobs_after - jobs_before, str(e))
"""


def outcome(conf, extra=""):
    code = DRIVER % {"conf": conf, "extra": extra}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=HERE)
    lines = [line for line in out.stdout.splitlines() if line.startswith("OUTCOME")]
    assert lines, out.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("conf, message", [
    ('"spark.dynamicAllocation.enabled": "true"', "ClusterError 0 Spark barrier stages cannot run with dynamic allocation"),
    ('"spark.ssl.enabled": "true"', "ClusterError 0 spark.ssl.enabled is on, but TensorFlow's gRPC traffic"),
])
def test_settings_are_refused_before_any_spark_job(conf, message):
    assert outcome(conf).startswith("OUTCOME " + message)


def test_encryption_refusal_can_be_overridden():
    assert outcome('"spark.ssl.enabled": "true"', "epochs=1, allow_unencrypted=True") == "OUTCOME fitted"


@pytest.mark.parametrize("master, calls", [
    ("local[2]", ("fit", "predict", "apply")),  # found on the driver: no task starts
    ("local-cluster[2,1,1024]", ("fit", "apply")),  # executors elsewhere: their failure is translated
])
def test_executors_whose_python_lacks_the_packages_are_named_with_the_fix(tmp_path, master, calls):
    from conftest import run_driver

    bare = tmp_path / "python3"  # what `python3` on PATH is for a newcomer: no pyarrow, no tfbarrier
    bare.write_text("#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n")
    bare.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYSPARK_PYTHON", None)
    outcome = run_driver("bare_python_driver.py", master, env=env)
    assert outcome["executor_python"] == "python3"
    for call in calls:
        assert outcome[call]["error"] == "ClusterError", outcome[call]
        message = outcome[call]["message"]
        assert re.search(r"has no module '(pyarrow|pandas|tfbarrier)'", message), message
        assert f"PYSPARK_PYTHON={sys.executable}" in message
        assert master != "local[2]" or f"run {bare}, which has no module 'pyarrow'" in message
