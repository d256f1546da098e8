"""Cluster settings a barrier stage cannot live with are refused on the driver, before any job.
These are settings a session starts with: one driver program runs each case in a SparkContext of its own,
one after another, in a JVM started with none of them."""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import run_driver

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = """
import json, sys
from conftest import digits_cnn, make_spark, worker_model
import pandas as pd
import tfbarrier
make_spark("local[2]").stop()  # the JVM starts (and keeps as system properties) no case's settings

for name, (conf, extra) in json.loads(sys.argv[1]).items():
    spark = make_spark("local[2]", **conf)
    df = spark.createDataFrame(pd.DataFrame({"pixels": [[0.0] * 64] * 4, "digit": [0, 1, 2, 3]}))
    jobs_before = len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))
    model = worker_model(digits_cnn()) if extra.pop("tf_keras", False) else digits_cnn()  # else Keras 3
    try:
        result = tfbarrier.fit(df, model, features="pixels", label="digit", batch_size=2, num_workers=2, **extra)
        how = {(w["communication"].get("encryption"), w["transfer"]["encryption"]) for w in result.workers}
        print("OUTCOME", name, "fitted", json.dumps(sorted(how)))
    except tfbarrier.errors.TfBarrierError as e:
        jobs_after = len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))
        print("OUTCOME", name, type(e).__name__, jobs_after - jobs_before, str(e))
    spark.stop()
"""
ENCRYPTED = {"spark.network.crypto.enabled": "true", "spark.authenticate": "true", "spark.authenticate.secret": "s"}
CASES = {
    "dynamic_allocation": ({"spark.dynamicAllocation.enabled": "true"}, {}),
    "ssl": ({"spark.ssl.enabled": "true"}, {"tf_keras": True, "exchange": "strategy"}),
    "ssl_allowed": ({"spark.ssl.enabled": "true"}, {"epochs": 1, "allow_unencrypted": True, "tf_keras": True,
                                                    "exchange": "strategy"}),
    "encrypted_keras3": (ENCRYPTED, {"epochs": 1}),
    "ssl_tf_keras": ({"spark.ssl.enabled": "true"}, {"epochs": 1, "tf_keras": True}),
}


@pytest.fixture(scope="module")
def outcomes():
    """{case: the line its fit printed: 'fitted', or the error's class, the jobs it ran and its message}."""
    out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(CASES)], capture_output=True, text=True,
                         timeout=300, cwd=HERE)
    found = dict(line.split(" ", 2)[1:] for line in out.stdout.splitlines() if line.startswith("OUTCOME "))
    return {name: found.get(name, out.stderr[-3000:]) for name in CASES}


@pytest.mark.parametrize("case, message", [
    ("dynamic_allocation", "ClusterError 0 Spark barrier stages cannot run with dynamic allocation"),
    ("ssl", "ClusterError 0 spark.ssl.enabled is on, but TensorFlow's gRPC traffic"),
])
def test_settings_are_refused_before_any_spark_job(outcomes, case, message):
    assert outcomes[case].startswith(message), outcomes[case]


def test_a_tf_keras_model_trains_in_an_encrypted_cluster_over_the_ring_with_both_over_tls(outcomes):
    # its implementation left at auto: tfbarrier's ring, not MultiWorkerMirroredStrategy's server
    assert re.fullmatch(r'fitted \[\["TLSv1\.3 TLS_\w+", "TLSv1\.3 TLS_\w+"\]\]', outcomes["ssl_tf_keras"]), \
        outcomes["ssl_tf_keras"]


def test_encryption_refusal_can_be_overridden(outcomes):
    # the strategy's gRPC (exchange "strategy") is not encrypted (allowed), the driver link is: Spark's
    # encryption is on
    assert re.fullmatch(r'fitted \[\[null, "TLSv1\.3 TLS_\w+"\]\]', outcomes["ssl_allowed"]), outcomes["ssl_allowed"]


def test_a_keras3_model_trains_in_an_encrypted_cluster_its_ring_and_driver_link_over_tls(outcomes):
    # the slides' CNN, which tf_keras can rebuild, takes the native path there: the workers' (ring, link)
    # encryption is TLS 1.3 for both, with no allow_unencrypted
    assert re.fullmatch(r'fitted \[\["TLSv1\.3 TLS_\w+", "TLSv1\.3 TLS_\w+"\]\]', outcomes["encrypted_keras3"]), \
        outcomes["encrypted_keras3"]


MASTERS = {
    "local[2]": ("fit", "predict", "apply"),  # found on the driver: no task starts
    "local-cluster[2,1,1024]": ("fit", "apply"),  # executors elsewhere: their failure is translated
}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """(the `python3` first on PATH, support/bare_python_driver.py's outcome on each of MASTERS)."""
    bin_dir = tmp_path_factory.mktemp("bare-python")
    bare = bin_dir / "python3"  # what `python3` on PATH is for a newcomer: no pyarrow, no tfbarrier
    bare.write_text("#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n")
    bare.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYSPARK_PYTHON", None)
    return bare, run_driver("bare_python_driver.py", *MASTERS, env=env)


@pytest.mark.parametrize("master", MASTERS)
def test_executors_whose_python_lacks_the_packages_are_named_with_the_fix(bare_python, master):
    bare, outcomes = bare_python
    outcome = outcomes[master]
    assert outcome["executor_python"] == "python3"
    for call in MASTERS[master]:
        assert outcome[call]["error"] == "ClusterError", outcome[call]
        message = outcome[call]["message"]
        assert re.search(r"has no module '(pyarrow|pandas|tfbarrier)'", message), message
        assert f"PYSPARK_PYTHON={sys.executable}" in message
        assert master != "local[2]" or f"run {bare}, which has no module 'pyarrow'" in message
