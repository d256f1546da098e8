"""What travels where (transfer.py): a model's weights go to the workers and come back through the
driver link, outside Spark, whose job and results stay a few kilobytes whatever the model's size;
where the executors cannot reach the link, the files go inside the job, through Spark. What Spark
receives is measured where pyspark hands it over (what_spark_gets), not with tfbarrier's own numbers."""

import contextlib
import dataclasses
import hashlib
import os
import socket
import time

import numpy as np
import pytest
from conftest import left_behind
from support import faults

import tfbarrier
from tfbarrier.spark import cluster, transfer
from tfbarrier.settings import DRIVER_LINK_CONF

KB = 2**10


@dataclasses.dataclass
class WhatSparkGot:
    """Bytes pyspark handed Spark during a block (what_spark_gets). ``functions``: each Python function
    Spark is to run (a stage's task function, a UDF), as pyspark's CloudPickleSerializer pickled it for
    the JVM; ``broadcasts``: each broadcast, as the file the JVM read it from (pyspark sends a function
    over 1 MB as a broadcast of its pickle: it counts in both); ``stages``: the mapInArrow calls;
    ``results``: per collect(), the bytes of the binary values in the rows the tasks sent back."""

    functions: list = dataclasses.field(default_factory=list)
    broadcasts: list = dataclasses.field(default_factory=list)
    stages: int = 0
    results: list = dataclasses.field(default_factory=list)

    def largest(self):
        """The largest single thing sent to Spark."""
        return max(self.functions + self.broadcasts, default=0)


@contextlib.contextmanager
def what_spark_gets(spark):
    """For the block, pyspark's own CloudPickleSerializer.dumps, SparkContext.broadcast, DataFrame.mapInArrow
    and DataFrame.collect are wrapped: each still does what it does, and what passes through is recorded
    in the WhatSparkGot yielded."""
    from pyspark.serializers import CloudPickleSerializer

    got = WhatSparkGot()
    frames, context = type(spark.range(1)), type(spark.sparkContext)
    dumps, broadcast, map_in_arrow, collect = (CloudPickleSerializer.dumps, context.broadcast, frames.mapInArrow,
                                               frames.collect)

    def recorded_dumps(self, obj):
        data = dumps(self, obj)
        got.functions.append(len(data))
        return data

    def recorded_broadcast(self, value):
        handle = broadcast(self, value)
        got.broadcasts.append(os.path.getsize(handle._path))
        return handle

    def recorded_map_in_arrow(self, *args, **kwargs):
        got.stages += 1
        return map_in_arrow(self, *args, **kwargs)

    def recorded_collect(self):
        rows = collect(self)
        got.results.append(sum(len(value) for row in rows for value in row if isinstance(value, (bytes, bytearray))))
        return rows

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CloudPickleSerializer, "dumps", recorded_dumps)
        patch.setattr(context, "broadcast", recorded_broadcast)
        patch.setattr(frames, "mapInArrow", recorded_map_in_arrow)
        patch.setattr(frames, "collect", recorded_collect)
        yield got


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


def fit(df, model, **kwargs):
    return tfbarrier.fit(df, model, features="pixels", label="digit", epochs=1, batch_size=64, num_workers=2,
                         steps_per_epoch=3, verbose=0, **kwargs)


def predicted(scored, model):
    """Whether ``scored`` (predict's output, as pandas) holds ``model``'s classes of its pixels."""
    x = np.stack(scored["pixels"].to_numpy()).astype("float32")
    return (scored["prediction"].to_numpy() == np.argmax(model.predict(x, verbose=0), axis=1)).all()


def test_the_model_goes_and_comes_back_through_the_driver_link_not_spark(spark, digits_df, wide_model):
    with what_spark_gets(spark) as got:
        result = fit(digits_df, wide_model)
    size = weights_bytes(wide_model)
    for worker in result.workers:
        assert worker["transfer"]["via"] == "driver link"
        assert size < worker["transfer"]["fetched_bytes"] < size + 64 * KB  # the weights file and the callbacks'
    assert size < result.workers[0]["transfer"]["sent_bytes"] < size + 64 * KB  # the chief's trained weights
    assert result.workers[1]["transfer"]["sent_bytes"] == 0
    # Spark got one stage, whose task function (the job inside) and results are a few KB: not the weights
    assert got.stages == 1 and got.functions and got.results, got
    assert got.largest() < 64 * KB and sum(got.results) < 64 * KB, got
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    trained, initial = result.model.get_weights(), wide_model.get_weights()
    assert [w.shape for w in trained] == [w.shape for w in initial] and not np.allclose(trained[0], initial[0])


def test_a_retried_fit_fetches_the_model_through_the_driver_link_again_not_through_spark(spark, digits_df,
                                                                                       wide_model):
    with what_spark_gets(spark) as got:
        result = fit(digits_df, wide_model, callbacks=faults.kill_first_attempt(worker=1, epoch=0), max_retries=1)
    first, second = result.attempts
    assert first["retryable"] and "killed by signal SIGKILL" in first["error"] and second["error"] is None
    assert [w["transfer"]["via"] for w in result.workers] == ["driver link", "driver link"]
    assert got.stages == 2 and got.functions, got  # a stage per attempt, neither carrying the weights
    assert got.largest() < 64 * KB and sum(got.results) < 64 * KB, got
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    assert left_behind() == []


def test_predict_serves_the_model_to_the_executors_through_the_driver_link_not_spark(spark, digits_df, wide_model):
    with what_spark_gets(spark) as got:
        scored = tfbarrier.predict(digits_df.limit(8), wide_model, features="pixels").toPandas()
    assert got.functions and got.broadcasts == [] and got.largest() < 64 * KB, got  # the UDF: config, no weights
    assert predicted(scored, wide_model)


def test_where_tfbarriers_traffic_is_encrypted_predict_serves_the_model_over_tls_not_spark(spark, digits_df,
                                                                                          wide_model):
    # spark.tfbarrier.encrypt=always stands in for a cluster that encrypts (spark.network.crypto.enabled is a
    # setting a session starts with): the model went in a broadcast there before, now through a TLS link
    spark.conf.set("spark.tfbarrier.encrypt", "always")
    try:
        with what_spark_gets(spark) as got:
            scored = tfbarrier.predict(digits_df.limit(8), wide_model, features="pixels").toPandas()
    finally:
        spark.conf.unset("spark.tfbarrier.encrypt")
    files, server = transfer.session_server(cluster.driver_host(spark), encrypted=True)
    assert got.functions and got.broadcasts == [] and got.largest() < 64 * KB, got
    assert server.tls is not None and server.endpoint["tls"].certificate.startswith(b"-----BEGIN CERTIFICATE")
    assert any(entry.name.endswith("scoring.safetensors") for entry in os.scandir(files.directory))
    assert server.rejected == 0 and predicted(scored, wide_model)


def test_predict_writes_a_models_weights_on_the_driver_once_and_again_only_when_they_change(spark, digits_df,
                                                                                            wide_model):
    # Each predict() wrote the weights again and put the file in place of the same one: for a 61 M-parameter
    # model, 0.5-0.8 s a call on the driver, against 0.18 s to find the content served already.
    import keras

    files, _ = transfer.session_server(cluster.driver_host(spark))

    def served():
        return {entry.name: entry.inode() for entry in os.scandir(files.directory)
                if entry.name.endswith("scoring.safetensors")}

    model = keras.models.clone_model(wide_model)
    model.set_weights(wide_model.get_weights())
    tfbarrier.predict(digits_df.limit(8), model, features="pixels").toPandas()
    first = served()
    scored = tfbarrier.predict(digits_df.limit(8), model, features="pixels").toPandas()
    assert served() == first and predicted(scored, model)
    model.set_weights([w * 0.5 for w in model.get_weights()])
    scored = tfbarrier.predict(digits_df.limit(8), model, features="pixels").toPandas()
    assert len(served()) == len(first) + 1 and predicted(scored, model)


def test_with_the_driver_link_off_the_model_goes_through_spark_and_still_trains_and_scores(spark, digits_df,
                                                                                            wide_model):
    spark.conf.set(DRIVER_LINK_CONF, "false")
    try:
        with what_spark_gets(spark) as fitting:
            result = fit(digits_df, wide_model)
        with what_spark_gets(spark) as scoring:
            scored = tfbarrier.predict(digits_df.limit(8), result, features="pixels").toPandas()
    finally:
        spark.conf.unset(DRIVER_LINK_CONF)
    size = weights_bytes(wide_model)
    assert [w["transfer"]["via"] for w in result.workers] == ["spark", "spark"]
    # the weights went in the stage's task function and came back in its results; predict's in a broadcast
    assert fitting.stages == 1 and fitting.largest() > size and sum(fitting.results) > size, fitting
    assert max(scoring.broadcasts, default=0) > size, scoring
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    assert predicted(scored, result.model)


def return_the_workers_index():
    import json
    import os

    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def test_tasks_that_cannot_reach_the_driver_link_get_the_job_again_with_its_files_inside(spark):
    import dataclasses

    from tfbarrier import progress
    from tfbarrier.spark import stage
    from tfbarrier.functions.jobs import RunJob
    from tfbarrier.user_code import pickle_user_code
    from tfbarrier.spark.transfer import JobFiles

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


def test_an_executors_copy_of_a_predict_model_is_used_only_while_it_is_the_file_its_digest_names(spark):
    from pyspark import SparkFiles

    from tfbarrier.predicting import scoring_models

    weights = b"the model's weights" * 100
    name = f"{hashlib.sha256(weights).hexdigest()[:32]}-scoring.safetensors"
    scoring = {"payload": transfer.Payload(name, len(weights), sha256=hashlib.sha256(weights).hexdigest()),
               "broadcast": spark.sparkContext.broadcast(weights)}
    path = scoring_models.weights_file(scoring)  # local mode: the executor's directory is the driver's
    assert os.path.dirname(path) == os.path.join(SparkFiles.getRootDirectory(), "tfbarrier-models")
    with open(path, "r+b") as f:  # changed where it is kept, its name (and its digest's prefix) unchanged
        f.write(b"planted")
    assert scoring_models.weights_file(scoring) == path
    assert open(path, "rb").read() == weights
