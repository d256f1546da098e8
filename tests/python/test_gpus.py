"""GPUs from Spark's resource scheduler, tested without a GPU: a fake discovery script makes Spark
schedule 'GPUs'; each training process reports the CUDA_VISIBLE_DEVICES it read before importing
TensorFlow (TensorFlow itself is not asked to use the fake devices)."""

import json
import os

import pytest
from conftest import run_driver

import tfbarrier
from tfbarrier.errors import ClusterError

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_GPUS = os.path.join(HERE, "support", "fake_gpus.sh")


def fit_elsewhere(master, conf, fits=1, **kwargs):
    return run_driver("gpu_fit.py", master, json.dumps(conf), json.dumps(kwargs), str(fits))


def test_each_task_sees_its_own_gpu_on_a_two_executor_cluster():
    conf = {
        "spark.worker.resource.gpu.amount": "2",  # each standalone worker offers 2 of the fake GPUs
        "spark.worker.resource.gpu.discoveryScript": FAKE_GPUS,
        "spark.executor.resource.gpu.amount": "2",
        "spark.executor.resource.gpu.discoveryScript": FAKE_GPUS,
        "spark.task.resource.gpu.amount": "1",
    }
    outcome = fit_elsewhere("local-cluster[2,2,1024]", conf, num_workers=4, batch_size=64, use_gpu=True)
    assert "error" not in outcome, outcome
    workers = outcome["workers"]
    assert all(len(w["gpus"].split(",")) == 1 for w in workers)  # one GPU per task
    assert len({w["executor"] for w in workers}) == 2  # two executors, two tasks each
    assert len({(w["executor"], w["gpus"]) for w in workers}) == 4  # no GPU handed to two tasks
    assert {w["gpus"] for w in workers} <= {"0", "1", "2", "3"}
    # one GPU per worker trains over tfbarrier's authenticated ring by default: no TensorFlow server listens
    assert {w["communication"]["implementation"] for w in workers} == {"tfbarrier ring (authenticated)"}
    # said once, with what it costs and the fix
    assert len(outcome["warned"]) == 1 and "communication={'implementation': 'nccl'}" in outcome["warned"][0]


def test_use_gpu_on_a_cluster_without_gpu_resources_is_refused_with_the_settings():
    outcome = fit_elsewhere("local-cluster[2,1,1024]", {}, num_workers=2, batch_size=64, use_gpu=True)
    assert outcome["error"] == "ClusterError"
    assert "spark.task.resource.gpu.amount" in outcome["message"]
    assert "spark.executor.resource.gpu.discoveryScript" in outcome["message"]


def test_local_mode_splits_the_drivers_gpus_among_the_tasks_spares_included():
    conf = {"spark.driver.resource.gpu.amount": "2", "spark.driver.resource.gpu.discoveryScript": FAKE_GPUS}
    outcome = fit_elsewhere("local[2]", conf, fits=3, num_workers=2, batch_size=64, use_gpu=True)
    # The later fits' processes are forked by keepers, which imported TensorFlow before their task came: each
    # must still have read its own task's GPU before that import (a keeper per task's GPUs).
    assert [[w["gpus"] for w in fit] for fit in outcome["fits"]] == [["0", "1"]] * 3
    assert [[w["warm_start"] for w in fit] for fit in outcome["fits"]] == [[False, False]] + [[True, True]] * 2


def test_local_mode_without_driver_gpus_is_refused(spark, digits_df):
    with pytest.raises(ClusterError, match="spark.driver.resource.gpu.amount"):
        tfbarrier.fit(digits_df, lambda: None, features="pixels", label="digit", use_gpu=True)


def test_gpus_are_hidden_unless_asked_for(two_worker_fit_gpus):
    assert two_worker_fit_gpus == ["", ""]


@pytest.fixture
def two_worker_fit_gpus(digits_df):
    from conftest import digits_cnn

    result = tfbarrier.fit(digits_df.limit(256), digits_cnn(), features="pixels", label="digit", epochs=1,
                           batch_size=64, num_workers=2)
    return [w["gpus"] for w in result.workers]
