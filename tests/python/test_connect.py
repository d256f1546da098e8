"""fit, run, apply, predict, cancellation and a large result with a Spark Connect session (SparkSession.builder.remote("local[2]")), which
has no SparkContext: every SparkContext-only step has a Connect path or a documented error."""

import pytest
from conftest import run_driver


@pytest.fixture(scope="module")
def connect_outcome():
    return run_driver("connect_driver.py", timeout=600)


def test_the_session_is_a_connect_session(connect_outcome):
    assert connect_outcome["session"].startswith("pyspark.sql.connect")


def test_the_digits_fit_reaches_the_same_bar_with_replicas_in_sync(connect_outcome):
    fit = connect_outcome["fit"]
    assert fit["accuracy"] >= 0.90
    assert len(set(fit["checksums"])) == 1 and all(rows > 0 for rows in fit["rows"])
    assert fit["epochs"] == 4 and fit["progress_from"] == [0, 1]


def test_run_returns_the_chiefs_value(connect_outcome):
    value = connect_outcome["run"]
    assert value["index"] == 0 and value["workers"] == 2 and value["replicas"] == 2


def test_predict_scores_every_row_like_the_local_model(connect_outcome):
    assert connect_outcome["predict"] == {"rows": 300, "same_as_local": 1.0}


def test_a_result_over_16_mib_arrives_whole(connect_outcome):
    assert connect_outcome["big_result"] == {"mib": 24.0, "same": True}


def test_apply_runs_once_per_partition(connect_outcome):
    assert connect_outcome["apply"] == {"partitions": [0, 1], "rows": 1497, "addresses": 2}


def test_a_timeout_cancels_the_job_and_leaves_no_training_process(connect_outcome):
    cancel = connect_outcome["cancel"]
    assert "ran past its timeout of 20 s" in cancel["error"]
    assert cancel["raised_after"] < 20 + 60 and cancel["left_behind"] == 0


def test_a_sparkcontext_only_option_gives_the_documented_error(connect_outcome):
    message = connect_outcome["archive"]
    assert "PythonEnv.from_archive() needs SparkContext.addArchive, which Spark Connect does not have" in message
    assert "PythonEnv(requirements=...)" in message


def test_a_vector_column_trains_a_keras_estimator_whose_saved_model_loads(connect_outcome):
    assert connect_outcome["spark_ml"] == {"epochs": 2, "same_after_load": True, "same_as_local": True}
