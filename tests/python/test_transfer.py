"""What travels where (transfer.py): a model's weights go to the workers and come back through the
driver link, outside Spark, whose job and results stay a few kilobytes whatever the model's size;
where the executors cannot reach the link, the files go inside the job, through Spark."""

import socket
import time

import numpy as np
import pytest
from conftest import left_behind

import tfbarrier
from tfbarrier.settings import DRIVER_LINK_CONF

KB = 2**10


@pytest.fixture(scope="module")
def wide_model():
    """About 4.7 MB of float32 weights: far more than a job or a result needs."""
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(2048, activation="relu"),
                              keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def weights_bytes(model):
    return sum(w.numpy().nbytes for w in model.weights)


def fit(df, model):
    return tfbarrier.fit(df, model, features="pixels", label="digit", epochs=1, batch_size=64, num_workers=2,
                         steps_per_epoch=3, verbose=0)


def test_the_model_goes_and_comes_back_through_the_driver_link_not_spark(digits_df, wide_model):
    result = fit(digits_df, wide_model)
    size = weights_bytes(wide_model)
    for worker in result.workers:
        assert worker["transfer"]["via"] == "driver link"
        assert size < worker["transfer"]["fetched_bytes"] < size + 64 * KB  # the weights file and the callbacks'
    assert size < result.workers[0]["transfer"]["sent_bytes"] < size + 64 * KB  # the chief's trained weights
    assert result.workers[1]["transfer"]["sent_bytes"] == 0
    carried = result.attempts[-1]["through_spark"]
    assert carried["job_bytes"] < 64 * KB and carried["result_bytes"] < 64 * KB, carried
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    trained, initial = result.model.get_weights(), wide_model.get_weights()
    assert [w.shape for w in trained] == [w.shape for w in initial] and not np.allclose(trained[0], initial[0])


def test_with_the_driver_link_off_the_model_goes_through_spark_and_still_trains_and_scores(spark, digits_df,
                                                                                            wide_model):
    spark.conf.set(DRIVER_LINK_CONF, "false")
    try:
        result = fit(digits_df, wide_model)
        scored = tfbarrier.predict(digits_df.limit(8), result, features="pixels").toPandas()
    finally:
        spark.conf.unset(DRIVER_LINK_CONF)
    size = weights_bytes(wide_model)
    assert [w["transfer"]["via"] for w in result.workers] == ["spark", "spark"]
    carried = result.attempts[-1]["through_spark"]
    assert carried["job_bytes"] > size and carried["result_bytes"] > size, carried
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    x = np.stack(scored["pixels"].to_numpy()).astype("float32")
    assert (scored["prediction"].to_numpy() == np.argmax(result.model.predict(x, verbose=0), axis=1)).all()


def return_the_workers_index():
    import json
    import os

    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def test_tasks_that_cannot_reach_the_driver_link_get_the_job_again_with_its_files_inside(spark):
    import dataclasses

    from tfbarrier import progress, stage
    from tfbarrier.job import RunJob, pickle_user_code
    from tfbarrier.transfer import JobFiles

    with socket.socket() as closed:  # a port nobody listens on: what a firewall looks like to a task
        closed.bind(("127.0.0.1", 0))
        unreachable = {"host": "127.0.0.1", "port": closed.getsockname()[1], "token": "t"}
    with JobFiles() as files:
        function = files.add_bytes("function.pkl", pickle_user_code((return_the_workers_index, (), {}),
                                                                    return_the_workers_index))
        job = RunJob(function=function, link=unreachable, started_at=time.time())
        with pytest.warns(progress.ProgressUnavailableWarning, match="runs again with its files inside it"):
            results, attempts = stage.submit_with_retries(spark.range(0, 2, numPartitions=2), job, files,
                                                          progress.ProgressDisplay(verbose=1))
        value = files.received(results[0].files["value"])
        with open(value, "rb") as f:
            import cloudpickle

            assert cloudpickle.load(f) == 0
    first, second = attempts
    assert first["error"].startswith("DriverUnreachableError: worker") and "could not connect" in first["error"]
    assert second["error"] is None and second["through_spark"]["job_bytes"] > function.size
    assert [r.transfer["via"] for r in results] == ["spark", "spark"]
    assert dataclasses.replace(job).function.data is None  # the caller's job is left as it was
    assert left_behind() == []
