"""Keras 3 models that tf_keras cannot rebuild (a custom layer written with keras.ops, a subclassed
model, a custom loss) train natively: 2 workers end with the weights and history of one Keras 3
process fed the same global batches; the trained model comes back in Keras 3, with its custom
classes; what the native path cannot do yet is refused on the driver, before the stage."""

import keras
import numpy as np
import pandas as pd
import pytest
from conftest import partitioned
from keras import ops

import tfbarrier
from tfbarrier.errors import InvalidArgumentError, ModelError

ROWS_PER_WORKER = 96
GLOBAL_BATCH = 32


class Gate(keras.layers.Layer):
    """A custom layer of keras.ops, not registered: the training processes get its class by value."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        return x * ops.sigmoid(x * self.scale)


class Drift(keras.layers.Layer):
    """A weight whose gradient is a constant (its added loss is linear in it, and nothing else reads it): TensorFlow's
    graph optimizer folds that gradient into a constant, whose buffer every step reuses."""

    def build(self, input_shape):
        self.drift = self.add_weight(shape=(3,), initializer="zeros", name="drift")

    def call(self, x):
        self.add_loss(1e-3 * ops.sum(self.drift))
        return x


@keras.saving.register_keras_serializable(package="tfbarrier_tests")
class TwoLayers(keras.Model):
    """A subclassed model: no config tf_keras could read, no symbolic input."""

    def __init__(self, units=16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units)
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(ops.tanh(self.hidden(x)))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def huberish(y_true, y_pred):
    """A custom loss function, not registered."""
    error = y_true - y_pred
    return ops.mean(ops.sqrt(1.0 + ops.square(error)) - 1.0, axis=-1)


OWN_OBJECTS = {"Gate": Gate, "huberish": huberish, "TwoLayers": TwoLayers, "Drift": Drift}


def gated_model():
    inputs = keras.Input((8,))
    hidden = Gate()(keras.layers.Dense(16)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=huberish, metrics=["mae"])
    return model


def drifting_model():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), Drift(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return model


def subclassed_model():
    model = TwoLayers()
    model(np.zeros((1, 8), "float32"))  # built, as a user's model is once called
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse", metrics=["mae"])
    return model


def line_data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2 * ROWS_PER_WORKER, 8)).astype("float32")
    y = (x @ np.linspace(-1, 1, 8) + 0.5).astype("float32")
    return x, y


@pytest.fixture(scope="module")
def line_df(spark):
    x, y = line_data()
    frame = pd.DataFrame({"x": list(x), "y": y})
    return partitioned(spark, frame, lambda i: int(i >= ROWS_PER_WORKER), 2)  # worker 0: rows [0, 96)


def copy_of(model):
    """The same model, weights and optimizer state, in this process."""
    with keras.saving.custom_object_scope(OWN_OBJECTS):
        clone = keras.models.clone_model(model)
        clone.set_weights(model.get_weights())
        clone.compile(**keras.saving.deserialize_keras_object(model.get_compile_config()))
    return clone


@pytest.mark.parametrize("build, options", [
    pytest.param(gated_model, {"steps_per_execution": 3}, marks=pytest.mark.versions),
    (subclassed_model, {"communication": {"bytes_per_pack": 600}}),  # 2 packs, last layers first: 4 + 64 + 64, 512 bytes
    # each gradient a pack of its own, summed where it lies: the constant one too, whose sum must not land in the
    # constant (before, it did, and the drift's step doubled each step)
    (drifting_model, {"communication": {"bytes_per_pack": 4}}),
], ids=["custom_layer_and_loss_3_steps_a_call", "subclassed_in_packs", "a_constant_gradient_in_packs_of_one"])
def test_two_workers_train_a_keras3_model_as_one_process_would(spark, line_df, build, options, tmp_path):
    keras.utils.set_random_seed(11)
    model = build()
    reference = copy_of(model)
    result = tfbarrier.fit(line_df, model, features="x", label="y", epochs=2, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False, save_to=str(tmp_path), **options)

    history = one_process(reference, epochs=2)

    assert type(result.model) is type(model) and keras_flavor_of(result.model) == "keras3"
    communication = result.workers[0]["communication"]
    assert communication["bytes_per_pack"] == options.get("communication", {}).get("bytes_per_pack", 16 * 2**20)
    assert result.workers[0]["steps_per_execution"] == options.get("steps_per_execution", 1)
    trained_as_one_process(result, model, reference, history)
    x, _ = line_data()
    np.testing.assert_allclose(result.model.predict(x[:4], verbose=0), reference.predict(x[:4], verbose=0),
                               rtol=1e-4, atol=1e-6)
    # save_to: the chief's Keras 3 archive of each epoch; the last one holds the trained weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-001.keras", "epoch-002.keras", "saved.json"]
    saved = keras.saving.load_model(tmp_path / "epoch-002.keras", custom_objects=OWN_OBJECTS)
    for trained, kept in zip(result.model.get_weights(), saved.get_weights()):
        np.testing.assert_array_equal(trained, kept)


def line_model():
    """A model function in Keras 3: fit(df, line_model) has each training process build it."""
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


def test_a_function_that_builds_a_keras3_model_trains_it_natively_as_one_process_would(spark, line_df, tmp_path):
    # (Before: "the model function built a Keras 3 model; inside tfbarrier workers build it with tf.keras".)
    result = tfbarrier.fit(line_df, line_model, features="x", label="y", epochs=2, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False, seed=11, save_to=str(tmp_path))

    keras.utils.set_random_seed(11)  # as each training process, before it calls the function
    reference = line_model()
    model = copy_of(reference)
    history = one_process(reference, epochs=2)
    assert keras_flavor_of(result.model) == "keras3"
    trained_as_one_process(result, model, reference, history)
    saved = keras.saving.load_model(tmp_path / "epoch-002.keras")
    for trained, kept in zip(result.model.get_weights(), saved.get_weights()):
        np.testing.assert_array_equal(trained, kept)
    with pytest.raises(ModelError, match="built a Keras 3 model, which MultiWorkerMirroredStrategy cannot train"):
        tfbarrier.fit(line_df, line_model, features="x", label="y", epochs=1, batch_size=GLOBAL_BATCH, num_workers=2,
                      exchange="strategy", max_retries=0)


def one_process(model, epochs, **fit_args):
    """``model`` trained by one process (its Keras's fit) on the global batches two workers make of line_df:
    step i takes rows [16i, 16i+16) of each worker's shard. Its history."""
    x, y = line_data()
    half = GLOBAL_BATCH // 2
    order = np.concatenate([np.r_[i:i + half, ROWS_PER_WORKER + i:ROWS_PER_WORKER + i + half]
                            for i in range(0, ROWS_PER_WORKER, half)])
    return model.fit(x[order], y[order], batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0,
                     **fit_args).history


def trained_as_one_process(result, model, reference, history):
    """The fit's ``result`` (over the ring, from ``model``) ends as ``reference`` trained by one_process did."""
    assert result.workers[0]["communication"]["implementation"].startswith("tfbarrier ring")
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]  # the replicas stayed equal
    for trained, expected in zip(result.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(trained, expected, rtol=1e-4, atol=1e-6)
    assert not np.allclose(result.model.get_weights()[0], model.get_weights()[0])  # training moved them
    for name in ("loss", "mae"):
        np.testing.assert_allclose(result.history[name], history[name], rtol=1e-4)


def keras_flavor_of(model):
    from tfbarrier.models.model_spec import keras_flavor

    return keras_flavor(model)


@pytest.mark.parametrize("option, what, fix", [
    ({"exchange": "strategy"}, "tfbarrier's ring only", "drop exchange='strategy'"),
])
def test_what_the_native_path_cannot_do_yet_is_refused_before_the_stage(spark, line_df, option, what, fix):
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(InvalidArgumentError, match=f"natively.*{what}.*{fix}"):
        tfbarrier.fit(line_df, gated_model(), features="x", label="y", num_workers=2, **option)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs


@pytest.mark.parametrize("build", [gated_model, subclassed_model], ids=["custom_layer_and_loss", "subclassed"])
def test_a_keras3_model_with_classes_of_its_own_scores_on_the_executors(spark, line_df, build):
    model = build()
    x, _ = line_data()
    scored = tfbarrier.predict(line_df, model, features="x", output="raw").toPandas()
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()), model.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_a_keras3_model_with_a_layer_of_its_own_is_a_feature_extractor_on_the_executors(spark, line_df):
    model = gated_model()
    x, _ = line_data()
    scored = tfbarrier.predict(line_df, model, features="x", output="features").toPandas()  # the Gate layer's output
    expected = keras.Model(model.inputs, model.layers[-2].output).predict(x, verbose=0)
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()), expected, rtol=1e-5, atol=1e-6)


def test_validation_counts_every_row_once_however_uneven_the_workers_shares(spark, line_df, tmp_path):
    keras.utils.set_random_seed(12)
    model = gated_model()
    reference = copy_of(model)
    x, y = line_data()
    rng = np.random.default_rng(4)
    xv = rng.normal(size=(41, 8)).astype("float32")
    yv = (xv @ np.linspace(-1, 1, 8)).astype("float32")
    validation = partitioned(spark, pd.DataFrame({"x": list(xv), "y": yv}), lambda i: int(i >= 30), 2)
    result = tfbarrier.fit(line_df, model, features="x", label="y", epochs=2, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False, validation_data=validation, tensorboard_dir=str(tmp_path))

    half = GLOBAL_BATCH // 2
    order = np.concatenate([np.r_[i:i + half, ROWS_PER_WORKER + i:ROWS_PER_WORKER + i + half]
                            for i in range(0, ROWS_PER_WORKER, half)])
    history = reference.fit(x[order], y[order], batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0,
                            validation_data=(xv, yv)).history
    for name in ("val_loss", "val_mae", "loss"):
        np.testing.assert_allclose(result.history[name], history[name], rtol=1e-4)
    # tensorboard_dir: the chief's Keras 3 TensorBoard logs, training and validation
    assert {path.parent.name for path in tmp_path.rglob("events.out.tfevents.*")} == {"train", "validation"}


@pytest.fixture
def native_path(spark):
    """spark.tfbarrier.keras3Training=native: Keras 3 models that tf_keras could rebuild train natively too."""
    spark.conf.set("spark.tfbarrier.keras3Training", "native")
    yield
    spark.conf.unset("spark.tfbarrier.keras3Training")


def keras3_overshooting_line():
    """conftest.overshooting_line in Keras 3."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(1.2), loss="mse")
    return model


def test_a_users_keras3_early_stopping_stops_every_worker_on_the_val_loss_of_all_of_them(opposite_workers,
                                                                                       native_path):
    def early_stopping():
        return [keras.callbacks.EarlyStopping(monitor="val_loss", patience=1)]

    result = tfbarrier.fit(opposite_workers[0], keras3_overshooting_line(), features="x", label="y", epochs=6,
                           batch_size=8, steps_per_epoch=1, num_workers=2, shuffle=False,
                           validation_data=opposite_workers[1], callbacks=early_stopping, timeout=300, verbose=0)
    assert result.workers[0]["communication"]["implementation"].startswith("tfbarrier ring")
    assert result.history["val_loss"] == pytest.approx([6.74, 7.2104], rel=1e-5)
    assert result.stopped_epoch == 1 and result.epochs == 2  # epoch 0 is the best, epoch 1 no better
    assert [w["steps"] for w in result.workers] == [2, 2]
    assert result.model.get_weights()[0].item() == pytest.approx(0.48, rel=1e-5)


@pytest.mark.parametrize("compression, expected", [("none", 1 + 2**-12), ("fp16", 1.0)])
def test_fp16_compression_sums_the_gradients_in_float16(spark, native_path, compression, expected):
    # As test_fidelity's tf_keras case: x = 1 + 2**-12 on every row, so each worker's gradient, -(1 + 2**-12) / 2,
    # is exact in float32 and rounds to -0.5 in float16; one step of SGD(1) on MAE adds the gradients' mean to w.
    frame = pd.DataFrame({"x": [[1 + 2**-12]] * 4, "y": [10.0] * 4})
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mae")
    result = tfbarrier.fit(partitioned(spark, frame, lambda i: i // 2, 2), model, features="x", label="y", epochs=1,
                           batch_size=4, num_workers=2, shuffle=False, communication={"compression": compression})
    assert result.workers[0]["communication"]["compression"] == compression
    assert result.model.get_weights()[0].item() == expected


def test_tune_ranks_keras3_models_that_train_natively(spark, line_df):
    def build(params):
        model = gated_model()
        model.optimizer.learning_rate.assign(params["learning_rate"])
        return model

    search = tfbarrier.tune(line_df, build, {"learning_rate": [1e-6, 0.05]}, features="x", label="y",
                            validation_split=0.25, epochs=3, batch_size=GLOBAL_BATCH, verbose=0, seed=3)
    assert list(search.trials["status"]) == ["ok", "ok"]
    assert search.best_params == {"learning_rate": 0.05}  # a rate of 1e-6 barely moves the weights
    assert isinstance(search.best_model.layers[2], Gate)


def test_mlflow_logs_a_native_fit_and_its_model_with_its_own_classes(spark, line_df, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from test_tracking import tracking_to

    with tracking_to(tmp_path) as client:
        result = tfbarrier.fit(line_df, gated_model(), features="x", label="y", epochs=2, batch_size=GLOBAL_BATCH,
                               num_workers=2, verbose=0, mlflow="native")
        run = client.get_run(result.mlflow_run_id)
        with keras.saving.custom_object_scope(OWN_OBJECTS):
            logged = mlflow.keras.load_model(f"runs:/{run.info.run_id}/model")
    assert run.info.status == "FINISHED" and run.data.params["model_kind"] == "keras3"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "loss")] == result.history["loss"]
    x, _ = line_data()
    np.testing.assert_allclose(logged.predict(x[:8], verbose=0), result.model.predict(x[:8], verbose=0), rtol=1e-6)


SEQUENCE, VOCABULARY = 12, 40


def token_data(rows, seed):
    """Sequences of token ids; the label says whether token 7 occurs in the sequence."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCABULARY, size=(rows, SEQUENCE))
    return ids.astype("int32"), (ids == 7).any(axis=1).astype("int64")


def kerashub_classifier():
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(21)
    inputs = keras.Input((SEQUENCE,), dtype="int32")
    embedded = keras_hub.layers.TokenAndPositionEmbedding(VOCABULARY, SEQUENCE, 16)(inputs)
    encoded = keras_hub.layers.TransformerEncoder(intermediate_dim=32, num_heads=2)(embedded)
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(encoded))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.005), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_kerashub_text_classifier_on_token_ids_trains_as_one_process_and_scores(spark):
    model = kerashub_classifier()
    reference = copy_of(model)
    ids, labels = token_data(2 * ROWS_PER_WORKER, seed=5)
    frame = pd.DataFrame({"ids": list(ids), "label": labels})
    df = partitioned(spark, frame, lambda i: int(i >= ROWS_PER_WORKER), 2)
    result = tfbarrier.fit(df, model, features="ids", label="label", epochs=3, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False)

    half = GLOBAL_BATCH // 2
    order = np.concatenate([np.r_[i:i + half, ROWS_PER_WORKER + i:ROWS_PER_WORKER + i + half]
                            for i in range(0, ROWS_PER_WORKER, half)])
    history = reference.fit(ids[order], labels[order], batch_size=GLOBAL_BATCH, epochs=3, shuffle=False,
                            verbose=0).history
    # The embedding's sparse gradient reaches Keras's sparse Adam as one process's would (every worker's rows):
    # densified, it moved the embedding by up to 0.15. Adam turns the float32 rounding of near-zero gradients
    # (the workers' backward passes add in another order) into steps of up to its rate: 3.4e-4 here.
    for trained, expected in zip(result.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(trained, expected, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(result.history["loss"], history["loss"], rtol=1e-4)
    assert result.history["accuracy"][-1] > result.history["accuracy"][0]

    scored = tfbarrier.predict(df, result.model, features="ids", output="raw").toPandas()
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()), result.model.predict(ids, verbose=0),
                               rtol=1e-4, atol=1e-5)


def test_a_native_worker_killed_mid_epoch_resumes_at_the_next_step_as_if_uninterrupted(spark, line_df, tmp_path):
    def fit(**kwargs):
        keras.utils.set_random_seed(11)
        return tfbarrier.fit(line_df, gated_model(), features="x", label="y", epochs=3, batch_size=GLOBAL_BATCH,
                             num_workers=2, seed=7, verbose=0, **kwargs)

    resumes_as_if_uninterrupted(fit, tmp_path)


def resumes_as_if_uninterrupted(fit, tmp_path):
    """``fit(**kwargs)`` of 3 epochs on line_df, once uninterrupted and once with worker 1 killed after epoch 1's
    step 4 and a save every 2 steps, ends alike: the rest of epoch 1 and epoch 2 ran again, nothing more."""
    from support import faults

    uninterrupted = fit()
    result = fit(checkpoint_dir=str(tmp_path), checkpoint_every=2, max_retries=1,
                 callbacks=faults.kill_after_step(worker=1, epoch=1, step=4))
    first, second = result.attempts
    assert "killed by signal SIGKILL" in first["error"]
    steps = uninterrupted.workers[0]["steps_per_epoch"]  # 6: 192 rows in batches of 32
    assert second["resumed_at"] == {"epoch": 1, "step": 4, "steps_done": steps + 4}  # saved after step 3 (the 4th)
    assert [w["steps"] for w in result.workers] == [2 * steps - 4] * 2  # the rest of epoch 1, then epoch 2
    for name, values in uninterrupted.history.items():
        np.testing.assert_allclose(result.history[name], values, rtol=1e-5, err_msg=name)
    for trained, expected in zip(result.model.get_weights(), uninterrupted.model.get_weights()):
        np.testing.assert_allclose(trained, expected, rtol=1e-5, atol=1e-6)
    assert not (tmp_path / "state").exists()  # a finished fit leaves nothing to resume


class StopsWorkerOne(keras.callbacks.Callback):
    """Stops worker 1 alone, after its third step (as TerminateOnNaN would on a NaN in its own batch's loss)."""

    def on_train_batch_end(self, batch, logs=None):
        import json
        import os

        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1 and batch == 2:
            self.model.stop_training = True


def test_a_stop_on_one_worker_stops_every_worker_after_the_same_step(spark, line_df):
    result = tfbarrier.fit(line_df, gated_model(), features="x", label="y", epochs=3, batch_size=GLOBAL_BATCH,
                           num_workers=2, verbose=0, timeout=240, callbacks=lambda: [StopsWorkerOne()])
    assert [w["steps"] for w in result.workers] == [3, 3]
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    assert len(result.history["loss"]) == 1 and result.stopped_epoch == 0


class AfterEachCall(keras.callbacks.Callback):
    """A batch-end hook that never stops the training, but could."""

    def on_train_batch_end(self, batch, logs=None):
        pass


def test_the_workers_agree_on_a_stop_after_every_call_only_when_a_callback_could_stop_there(spark, line_df):
    sent = {}
    for name, callbacks in (("plain", None), ("hooked", lambda: [AfterEachCall()])):
        result = tfbarrier.fit(line_df, gated_model(), features="x", label="y", epochs=1, batch_size=GLOBAL_BATCH,
                               num_workers=2, verbose=0, seed=3, callbacks=callbacks)
        sent[name] = [w["communication"]["bytes_sent"] for w in result.workers]
    steps = result.workers[0]["steps"]
    # Each call of the hooked fit sums one stop flag more: a float64 split in 2 chunks, sent in 2 steps of the ring,
    # each with its 8-byte sequence number. (Before, the plain fit exchanged it after every call too.)
    assert [hooked - plain for hooked, plain in zip(sent["hooked"], sent["plain"])] == [steps * (2 * 8 + 8)] * 2
    from tfbarrier.exchange.ring_hooks import stops_after_a_call

    assert stops_after_a_call(keras.callbacks.TerminateOnNaN()) and stops_after_a_call(AfterEachCall())
    assert not stops_after_a_call(keras.callbacks.EarlyStopping()) and not stops_after_a_call(keras.callbacks.History())
    assert not stops_after_a_call(keras.callbacks.TensorBoard())  # a batch-end hook, the chief's alone: never stops
    import tf_keras

    assert not stops_after_a_call(tf_keras.callbacks.TensorBoard()) and stops_after_a_call(tf_keras.callbacks.TerminateOnNaN())
    assert stops_after_a_call(keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None))
    assert not stops_after_a_call(keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None))


@keras.saving.register_keras_serializable(package="tfbarrier_tests")
class TwoOptimizers(TwoLayers):
    """A custom train_step that updates its second layer through an optimizer of its own, not model.optimizer:
    that layer's gradients would never cross between the workers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.own_optimizer = keras.optimizers.SGD(0.1)

    def train_step(self, data):
        import tensorflow as tf

        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads[:2], self.trainable_variables[:2])
        self.own_optimizer.apply(grads[2:], self.trainable_variables[2:])
        return {"loss": loss}


def test_a_step_that_updates_weights_without_model_optimizer_is_refused_naming_them(spark, line_df):
    model = TwoOptimizers()
    model(np.zeros((1, 8), "float32"))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    # the second layer's weights, by their paths (the first layer's went through model.optimizer)
    with pytest.raises(tfbarrier.errors.ModelError, match=r"updated \S*dense\S*/kernel, \S*dense\S*/bias without "
                                                          "model.optimizer"):
        tfbarrier.fit(line_df, model, features="x", label="y", epochs=1, batch_size=GLOBAL_BATCH, num_workers=2,
                      steps_per_epoch=2, verbose=0)
