"""fit() end to end on a real local[2] Spark with real TensorFlow."""

import json
import os

import numpy as np
import pandas as pd
import pytest
import tf_keras
from conftest import digits_cnn, held_out_accuracy, left_behind, partitioned

import tfbarrier
from tfbarrier.errors import ReplicasDivergedError
from tfbarrier.results import TIMINGS


@pytest.fixture(scope="module")
def input_model():
    """The model handed to fit, and a copy of its weights from before."""
    model = digits_cnn()
    return model, [w.copy() for w in model.get_weights()]


@pytest.fixture(scope="module")
def two_worker_fit(digits_df, input_model):
    return tfbarrier.fit(digits_df, input_model[0], features="pixels", label="digit",
                         epochs=4, batch_size=64, num_workers=2, seed=1)


@pytest.mark.versions
def test_two_workers_learn_digits_to_90_percent_held_out_over_tfbarriers_ring(two_worker_fit, digits):
    assert held_out_accuracy(two_worker_fit.model, digits[1]) >= 0.90
    assert all(w["communication"]["implementation"].startswith("tfbarrier ring") for w in two_worker_fit.workers)


class NudgeWorker1(tf_keras.callbacks.Callback):
    """At the end of training, worker 1 moves one of its weights: its replica is no longer worker 0's."""

    def on_train_end(self, logs=None):
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
            weight = self.model.trainable_weights[0]
            weight.assign(weight + 1e-3)


def test_workers_that_end_with_different_weights_fail_the_fit_naming_each_ones_checksum(digits_df):
    with pytest.raises(ReplicasDivergedError, match="worker 0: [0-9a-f]+, worker 1: [0-9a-f]+") as caught:
        tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64,
                      num_workers=2, steps_per_epoch=2, callbacks=lambda: [NudgeWorker1()], verbose=0)
    assert len(set(caught.value.checksums)) == 2


@pytest.mark.versions
def test_where_traffic_must_be_encrypted_the_ring_and_the_driver_link_are_tls(spark, digits_df):
    spark.conf.set("spark.tfbarrier.encrypt", "always")  # stands in for a cluster that encrypts its own traffic
    try:
        result = tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64,
                               num_workers=2, steps_per_epoch=3, verbose=0)
    finally:
        spark.conf.unset("spark.tfbarrier.encrypt")
    for worker in result.workers:
        assert worker["communication"]["encryption"].startswith("TLSv1.3"), worker["communication"]
        assert worker["transfer"]["encryption"].startswith("TLSv1.3"), worker["transfer"]


def test_replicas_end_with_identical_weights(two_worker_fit):
    checksums = {w["checksum"] for w in two_worker_fit.workers}
    assert len(two_worker_fit.workers) == 2 and len(checksums) == 1


def test_each_worker_trains_on_its_own_nonempty_shard(two_worker_fit, digits):
    workers = two_worker_fit.workers
    assert [w["index"] for w in workers] == [0, 1]
    assert all(w["rows"] > 0 for w in workers)
    assert sum(w["rows"] for w in workers) == len(digits[0])
    assert workers[0]["shard_checksum"] != workers[1]["shard_checksum"]
    assert workers[0]["port"] != workers[1]["port"]


def test_history_has_one_entry_per_epoch(two_worker_fit):
    history = two_worker_fit.history
    assert set(history) == {"loss", "accuracy"}
    assert all(len(values) == 4 for values in history.values())
    assert history["loss"][-1] < history["loss"][0]


def test_every_worker_runs_the_agreed_steps(two_worker_fit, digits):
    steps_per_epoch = -(-len(digits[0]) // 64)
    assert [w["steps_per_epoch"] for w in two_worker_fit.workers] == [steps_per_epoch] * 2
    assert [w["steps"] for w in two_worker_fit.workers] == [4 * steps_per_epoch] * 2


def test_timings_cover_each_phase_in_order(two_worker_fit):
    t = two_worker_fit.timings
    for phase in ("prepare", "stage_start", "data_shard", "worker_start", "rendezvous", "strategy_and_model",
                  "first_step", "training", "time_to_first_step", "total"):
        assert t[phase] >= 0, phase
    assert t["data_shard"] <= t["worker_start"]  # the shard is written before the task waits for the port
    assert t["first_step"] <= t["training"]
    # The phases before the first step follow one another on one machine's clock.
    before_first_step = (t["prepare"] + t["stage_start"] + t["worker_start"] + t["rendezvous"]
                         + t["strategy_and_model"] + t["first_step"])
    assert before_first_step <= t["time_to_first_step"] + 0.05
    assert t["time_to_first_step"] + (t["training"] - t["first_step"]) <= t["total"] + 0.05
    assert sorted(set(t) - set(TIMINGS)) == [], "timings that results.TIMINGS does not document"


def test_model_comes_back_in_the_users_keras_without_touching_the_input(two_worker_fit, input_model, digits):
    import keras
    import numpy as np

    model, weights_before = input_model
    assert isinstance(two_worker_fit.model, keras.Model) and two_worker_fit.model is not model
    assert two_worker_fit.model.optimizer is not None  # compiled: evaluate() works
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), weights_before))  # input untouched
    assert held_out_accuracy(model, digits[1]) < 0.5 <= held_out_accuracy(two_worker_fit.model, digits[1])


def test_the_returned_models_optimizer_makes_its_slots_when_it_first_trains_not_on_arrival(two_worker_fit, digits):
    # Adam's slots are two copies of the weights: the driver holds none until the model trains again.
    optimizer = two_worker_fit.model.optimizer
    assert not optimizer.built and len(optimizer.variables) == 2  # its step count and learning rate
    x = np.stack(digits[1]["pixels"].to_numpy()[:8]).reshape(-1, 8, 8, 1).astype("float32")
    two_worker_fit.model.train_on_batch(x, digits[1]["digit"].to_numpy()[:8])
    assert len(optimizer.variables) == 2 + 2 * len(two_worker_fit.model.trainable_weights)


def test_uneven_partitions_train_to_the_end(spark, digits):
    train = digits[0]
    cut = int(len(train) * 0.7)
    uneven = partitioned(spark, train, lambda i: int(i >= cut), 2)  # rows [0, cut) | [cut, end)
    assert uneven.rdd.getNumPartitions() == 2
    result = tfbarrier.fit(uneven, digits_cnn(), features="pixels", label="digit",
                           epochs=2, batch_size=64, num_workers=2)
    assert [w["rows"] for w in result.workers] == [cut, len(train) - cut]
    assert result.workers[0]["steps"] == result.workers[1]["steps"] == 2 * -(-len(train) // 64)
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]


def test_a_dataframe_with_an_empty_partition_is_repartitioned_and_trains(spark, digits):
    train = digits[0]
    lopsided = partitioned(spark, train, lambda i: 0, 2)  # every row in partition 0, partition 1 empty
    assert lopsided.rdd.glom().map(len).collect() == [len(train), 0]
    result = tfbarrier.fit(lopsided, digits_cnn(), features="pixels", label="digit", batch_size=64,
                           num_workers=2, verbose=0)
    rows = [w["rows"] for w in result.workers]
    assert min(rows) > 0 and sum(rows) == len(train)


def test_one_worker(digits_df, digits):
    result = tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit",
                           epochs=4, batch_size=64, num_workers=1, seed=1)
    assert len(result.workers) == 1 and result.workers[0]["rows"] == len(digits[0])
    assert held_out_accuracy(result.model, digits[1]) >= 0.90


def test_numeric_feature_columns_and_a_model_function(spark):
    """Features as plain numeric columns; the model built by a function with tf.keras in the worker."""
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 3))
    frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": (x @ [1.0, -2.0, 0.5] > 0).astype("int32")})

    def build():
        import tensorflow as tf

        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.5), loss="binary_crossentropy", metrics=["accuracy"])
        return model

    result = tfbarrier.fit(spark.createDataFrame(frame), build, features=["a", "b", "c"], label="y",
                           epochs=5, batch_size=32, num_workers=2)
    import tf_keras

    assert isinstance(result.model, tf_keras.Model)
    # built in each worker with no seed: they still train one model (the ring starts them from worker 0's weights)
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    assert result.history["accuracy"][-1] > 0.9
    predicted = (result.model.predict(x.astype("float32"), verbose=0)[:, 0] > 0.5).astype("int32")
    assert np.mean(predicted == frame["y"].to_numpy()) > 0.9


def test_no_training_process_outlives_its_fit(two_worker_fit):
    assert left_behind() == []


def tf_keras_cnn():
    """A model function: built in each training process, so its initial weights come from the seed."""
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Conv2D(8, 3, activation="relu"),
                                 tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("model", ["object", "function"])
def test_the_same_seed_gives_the_same_weights_and_another_seed_does_not(digits_df, model):
    # A model object brings its initial weights (the seed orders the data); a function's are drawn from the seed.
    model = digits_cnn() if model == "object" else tf_keras_cnn

    def checksum(seed):
        result = tfbarrier.fit(digits_df, model, features="pixels", label="digit", epochs=1, batch_size=64,
                               num_workers=2, seed=seed, verbose=0)
        return result.workers[0]["checksum"]

    first = checksum(5)
    assert checksum(5) == first
    assert checksum(6) != first


def record_threads(directory):
    """A callbacks factory (it runs in each training process): notes the process's TensorFlow thread pools."""

    def factory():
        import json
        import os

        import tensorflow as tf

        threads = {"intra": tf.config.threading.get_intra_op_parallelism_threads(),
                   "inter": tf.config.threading.get_inter_op_parallelism_threads()}
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        with open(os.path.join(directory, f"worker-{index}.json"), "w") as f:
            json.dump(threads, f)
        return []

    return factory


def test_tf_threads_sets_each_processs_thread_pools_spares_included(digits_df, tmp_path):
    import json

    seen = {}
    for threads in (1, 3):  # the second fit's processes are the spares the first left
        directory = tmp_path / str(threads)
        directory.mkdir()
        result = tfbarrier.fit(digits_df.limit(256), digits_cnn(), features="pixels", label="digit", epochs=1,
                               batch_size=64, num_workers=2, tf_threads=threads,
                               callbacks=record_threads(str(directory)), verbose=0)
        seen[threads] = ([json.loads((directory / f"worker-{i}.json").read_text()) for i in (0, 1)],
                         [w["warm_start"] for w in result.workers])
    assert seen[1][0] == [{"intra": 1, "inter": 2}] * 2
    assert seen[3][0] == [{"intra": 3, "inter": 3}] * 2 and seen[3][1] == [True, True]


def test_save_writes_a_keras_archive_and_export_a_savedmodel_that_predict_alike(two_worker_fit, digits, tmp_path):
    import keras
    import numpy as np
    import tensorflow as tf

    x = np.stack(digits[1]["pixels"].to_numpy()[:16]).reshape(-1, 8, 8, 1).astype("float32")
    expected = two_worker_fit.model.predict(x, verbose=0)
    archive = two_worker_fit.save(tmp_path / "digits.keras")
    np.testing.assert_allclose(keras.saving.load_model(archive).predict(x, verbose=0), expected, atol=1e-5)
    served = tf.saved_model.load(str(two_worker_fit.export(tmp_path / "digits_savedmodel")))
    np.testing.assert_allclose(served.serve(x).numpy(), expected, atol=1e-5)
    with pytest.raises(tfbarrier.errors.InvalidArgumentError, match="must end in .keras"):
        two_worker_fit.save(tmp_path / "digits.h5")


def test_frozen_base_layers_stay_bit_identical_and_the_head_trains(digits_df):
    """Transfer learning: layers with trainable=False keep it through the Keras 3 -> tf_keras translation
    and in every worker."""
    model = digits_cnn()
    for layer in model.layers[:-1]:
        layer.trainable = False
    model.compile(optimizer="adam", loss=model.loss, metrics=["accuracy"])  # trainable is read at compile time
    before = [layer.get_weights() for layer in model.layers]
    result = tfbarrier.fit(digits_df, model, features="pixels", label="digit", epochs=1, batch_size=64, verbose=0)
    after = [layer.get_weights() for layer in result.model.layers]
    for was, now in zip(before[:-1], after[:-1]):
        assert all(np.array_equal(w, n) for w, n in zip(was, now))
    assert not np.allclose(before[-1][0], after[-1][0])
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
