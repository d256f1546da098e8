"""Models of several inputs and outputs train from columns: ``features={input name: column}`` and
``label={output name: column}``. A three-input, two-output Keras 3 model on 2 workers ends with the
weights, history and validation metrics of one Keras 3 process fed the same global batches; integer
columns reach it as integers (exact past float32's 2**24); a KerasHub backbone with a classifier head
trains and predicts; what cannot work is refused on the driver, naming the fix."""

import keras
import numpy as np
import pandas as pd
import pytest
import tf_keras
from conftest import partitioned
from keras import ops

import tfbarrier
from tfbarrier.errors import InvalidArgumentError, ModelError

ROWS_PER_WORKER = 48
GLOBAL_BATCH = 16
BIG = 2**24  # float32 holds integers exactly up to here: BIG + 1 would arrive as BIG


class Remainder(keras.layers.Layer):
    """Token ids modulo the vocabulary: the ids are BIG + a small id, so ids that lost their last bit as
    float32 would pick other embedding rows."""

    def call(self, ids):
        return ops.mod(ids, 20)


def multi_model():
    ids = keras.Input((6,), name="ids", dtype="int64")
    num = keras.Input((2,), name="num")
    scale = keras.Input((1,), name="scale")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(20, 4)(Remainder()(ids)))
    hidden = keras.layers.Dense(8, activation="tanh")(keras.layers.Concatenate()([embedded, num, scale]))
    model = keras.Model([ids, num, scale], [keras.layers.Dense(2, activation="softmax", name="cls")(hidden),
                                            keras.layers.Dense(1, name="reg")(hidden)])
    model.compile(optimizer=keras.optimizers.Adam(0.02),
                  loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"}, loss_weights={"cls": 1.0, "reg": 0.5},
                  metrics={"cls": ["accuracy"]})
    return model


def columns(rows, seed):
    """The rows' columns: {column: values}; the model's x and y are views of them."""
    rng = np.random.default_rng(seed)
    ids = BIG + rng.integers(0, 20, (rows, 6))
    num = rng.normal(size=(rows, 2)).astype("float32")
    scale = rng.uniform(0.5, 1.5, rows).astype("float32")
    odd = (ids % 2).sum(axis=1)
    return {"ids": ids, "num": num, "scale": scale, "kind": (odd > 3).astype("int64"),
            "target": (num[:, 0] * scale + odd / 6).astype("float32")}


def model_x(data):
    return {"ids": data["ids"], "num": data["num"], "scale": data["scale"][:, None]}


def model_y(data):
    return {"cls": data["kind"], "reg": data["target"]}


FEATURES = {"ids": "token_ids", "num": "numbers", "scale": "scale"}
LABELS = {"cls": "kind", "reg": "target"}


def frame_of(data):
    return pd.DataFrame({"token_ids": list(data["ids"]), "numbers": list(data["num"].astype("float64")),
                         "scale": data["scale"].astype("float64"), "kind": data["kind"], "target": data["target"]})


@pytest.fixture(scope="module")
def trained(spark):
    """The model trained on 2 workers (worker 0: rows [0, 48)), validated on 20 rows split 12/8, and the
    same model trained by one Keras 3 process on the same global batches."""
    keras.utils.set_random_seed(5)
    model = multi_model()
    with keras.saving.custom_object_scope({"Remainder": Remainder}):
        reference = keras.models.clone_model(model)
    reference.set_weights(model.get_weights())
    reference.compile(**keras.saving.deserialize_keras_object(model.get_compile_config()))
    data, held = columns(2 * ROWS_PER_WORKER, 1), columns(20, 2)
    df = partitioned(spark, frame_of(data), lambda i: int(i >= ROWS_PER_WORKER), 2)
    validation = partitioned(spark, frame_of(held), lambda i: int(i >= 12), 2)
    result = tfbarrier.fit(df, model, features=FEATURES, label=LABELS, epochs=2, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False, validation_data=validation, verbose=0)
    half = GLOBAL_BATCH // 2
    order = np.concatenate([np.r_[i:i + half, ROWS_PER_WORKER + i:ROWS_PER_WORKER + i + half]
                            for i in range(0, ROWS_PER_WORKER, half)])
    ordered = {name: values[order] for name, values in data.items()}
    # validation in one batch: Keras 3's per-output losses (cls_loss) in evaluate are a plain mean of its batches'
    # means (16 rows, then 4: not the rows' mean), where tfbarrier's are the mean over the rows, as its val_loss
    history = reference.fit(model_x(ordered), model_y(ordered), batch_size=GLOBAL_BATCH, epochs=2, shuffle=False,
                            validation_data=(model_x(held), model_y(held)), validation_batch_size=20,
                            verbose=0).history
    return {"result": result, "model": model, "reference": reference, "history": history, "df": df, "data": data}


@pytest.mark.versions
def test_two_workers_train_several_inputs_and_outputs_as_one_process_would(trained):
    result, reference, history = trained["result"], trained["reference"], trained["history"]
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    for got, expected in zip(result.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    assert not np.allclose(result.model.get_weights()[0], trained["model"].get_weights()[0])  # training moved them
    # each output's loss and metric, and the validation's, as Keras names them
    for name in ("loss", "cls_loss", "reg_loss", "cls_accuracy", "val_loss", "val_cls_loss", "val_reg_loss",
                 "val_cls_accuracy"):
        np.testing.assert_allclose(result.history[name], history[name], rtol=1e-4, err_msg=name)


def test_integer_columns_reach_the_model_as_integers(spark, trained):
    """The same fit with the ids made float32 first (what a float32 column would give) ends elsewhere: the
    fit above matched one process only because the ids arrived exact."""
    rounded = {**trained["data"], "ids": trained["data"]["ids"].astype("float32").astype("int64")}
    assert (rounded["ids"] != trained["data"]["ids"]).any()
    keras.utils.set_random_seed(5)
    model = multi_model()
    model.fit(model_x(rounded), model_y(rounded), batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    assert not np.allclose(model.get_weights()[0], trained["reference"].get_weights()[0], rtol=1e-4, atol=1e-6)


def test_predict_scores_several_inputs_into_a_column_per_output(trained):
    result, df, data = trained["result"], trained["df"], trained["data"]
    local = result.model.predict(model_x(data), verbose=0)
    scored = tfbarrier.predict(df, result, features=FEATURES, output="raw")
    assert scored.columns == [*df.columns, "prediction_cls", "prediction_reg"]
    # the scores' struct is computed once a row, whatever the columns taken from it
    plan = scored._jdf.queryExecution().executedPlan().toString()
    assert plan.count("EvalPython") == 1, plan
    rows = scored.toPandas()
    order = np.argsort(rows["scale"].to_numpy())  # rows come back in any order: matched by their own scale
    expected = np.argsort(data["scale"])
    np.testing.assert_allclose(np.stack(rows["prediction_cls"])[order], local[0][expected], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.stack(rows["prediction_reg"])[order], local[1][expected], rtol=1e-4, atol=1e-6)
    # one output, in a column of the user's: "class" of the softmax head
    chosen = tfbarrier.predict(df, result, features=FEATURES, output_col={"cls": "kind_predicted"}).toPandas()
    assert list(chosen.columns) == [*df.columns, "kind_predicted"]
    order = np.argsort(chosen["scale"].to_numpy())
    np.testing.assert_array_equal(chosen["kind_predicted"].to_numpy()[order], local[0][expected].argmax(axis=1))
    # on the driver: a dict of each output's scores
    frame = {"token_ids": data["ids"], "numbers": data["num"], "scale": data["scale"]}
    here = tfbarrier.predict_local(result, frame, features=FEATURES, output="raw")
    assert list(here) == ["cls", "reg"]
    np.testing.assert_allclose(here["reg"], local[1], rtol=1e-4, atol=1e-6)


def test_a_spark_ml_estimator_takes_a_column_per_input_and_output_and_saves_them(spark, trained, tmp_path):
    """From a Parquet file, too (a plain scan, which tfbarrier otherwise reads in the tasks itself)."""
    from tfbarrier.ml import KerasEstimator, KerasModel

    trained["df"].write.parquet(str(tmp_path / "data"))
    df, data = spark.read.parquet(str(tmp_path / "data")), trained["data"]
    keras.utils.set_random_seed(5)
    estimator = KerasEstimator(model=multi_model(), featuresCols=FEATURES, labelCols=LABELS, epochs=1, batchSize=16,
                               numWorkers=2, verbose=0)
    fitted = estimator.fit(df)
    assert set(fitted.history) >= {"cls_loss", "reg_loss"}
    assert any(isinstance(layer, Remainder) for layer in fitted.keras_model.layers)  # the model's own class
    fitted.write().save(str(tmp_path / "model"))
    with keras.saving.custom_object_scope({"Remainder": Remainder}):  # as Keras loads a model of custom classes
        loaded = KerasModel.load(str(tmp_path / "model"))
    scored = loaded.transform(df)
    assert scored.schema["prediction_cls"].dataType.simpleString() == "double"  # a class id, as Spark ML's
    rows = scored.toPandas()
    order, expected = np.argsort(rows["scale"].to_numpy()), np.argsort(data["scale"])
    local = fitted.keras_model.predict(model_x(data), verbose=0)
    np.testing.assert_array_equal(rows["prediction_cls"].to_numpy()[order], local[0][expected].argmax(axis=1))


def test_several_inputs_are_refused_where_they_cannot_work(spark, trained):
    df, model = trained["df"], multi_model()
    with pytest.raises(ModelError, match=r"inputs \['ids', 'num', 'scalar'\].*model's inputs are \['ids', 'num', "
                                         r"'scale'\].*keras.Input\(name="):
        tfbarrier.fit(df, model, features={**{k: v for k, v in FEATURES.items() if k != "scale"}, "scalar": "scale"},
                      label=LABELS, num_workers=2)
    with pytest.raises(InvalidArgumentError, match=r"output_col must be .* outputs \['cls', 'reg'\]"):
        tfbarrier.predict(df, trained["result"], features=FEATURES, output_col={"head": "x"})
    with pytest.raises(InvalidArgumentError, match="class_weight with a label per output.*sample_weight"):
        tfbarrier.fit(df, model, features=FEATURES, label=LABELS, class_weight={0: 1.0, 1: 2.0}, num_workers=2)
    with pytest.raises(InvalidArgumentError, match="features as a dict must map each model input's name to a column"):
        tfbarrier.fit(df, model, features={"ids": ["token_ids"]}, label=LABELS, num_workers=2)
    legacy = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
    legacy.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ModelError, match="needs a Keras 3 model that trains natively"):
        tfbarrier.fit(df, legacy, features={"input": "numbers"}, label="target", num_workers=2)


def test_a_keras_hub_backbone_with_a_classifier_head_trains_and_predicts_from_columns(spark):
    """A BERT backbone of one small layer, from a config (nothing downloaded), under KerasHub's classifier
    head: three inputs (token ids, segment ids, padding mask), each an integer array column."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(7)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=8)
    model = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2, preprocessor=None, dropout=0.0)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    rng = np.random.default_rng(9)
    lengths = rng.integers(3, 9, 64)
    mask = (np.arange(8) < lengths[:, None]).astype("int64")
    ids = rng.integers(1, 30, (64, 8)) * mask
    frame = pd.DataFrame({"ids": list(ids), "segments": list(np.zeros_like(ids)), "mask": list(mask),
                          "label": (ids[:, 0] > 15).astype("int64")})
    df = spark.createDataFrame(frame).repartition(2)
    features = {"token_ids": "ids", "segment_ids": "segments", "padding_mask": "mask"}
    result = tfbarrier.fit(df, model, features=features, label="label", epochs=2, batch_size=16, num_workers=2,
                           verbose=0)
    assert type(result.model) is type(model) and len(result.history["loss"]) == 2
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]
    scored = tfbarrier.predict(df, result, features=features, output="probabilities").toPandas()
    logits = result.model.predict({"token_ids": np.stack(scored["ids"]), "segment_ids": np.stack(scored["segments"]),
                                   "padding_mask": np.stack(scored["mask"])}, verbose=0)
    expected = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)  # the head outputs logits
    np.testing.assert_allclose(np.stack(scored["prediction"]), expected, rtol=1e-4, atol=1e-6)
