"""Bad input is refused on the driver, before any barrier stage, with a message that names the fix."""

import pandas as pd
import pytest
from conftest import digits_cnn

import tfbarrier
from tfbarrier.errors import ClusterError, ColumnError, InvalidArgumentError, ModelError


@pytest.fixture(scope="module")
def small_df(spark):
    frame = pd.DataFrame({
        "pixels": [[0.0] * 64] * 8, "digit": list(range(8)), "name": ["x"] * 8, "short": [[0.0] * 10] * 8,
    })
    return spark.createDataFrame(frame)


def fit(df, model=None, **overrides):
    kwargs = dict(features="pixels", label="digit", epochs=1, batch_size=4, num_workers=2)
    kwargs.update(overrides)
    return tfbarrier.fit(df, model or digits_cnn(), **kwargs)


@pytest.mark.parametrize("overrides, error, message", [
    ({"features": "nope"}, ColumnError, "column 'nope' is not in the DataFrame"),
    ({"label": "nope"}, ColumnError, "column 'nope' is not in the DataFrame"),
    ({"label": "name"}, ColumnError, "label column 'name' has type string; it must be numeric"),
    ({"features": ["digit", "name"]}, ColumnError, "feature column 'name' has type string"),
    ({"features": "short"}, ModelError, "each row has 10 feature values but the model's input shape"),
    ({"epochs": 0}, InvalidArgumentError, "epochs must be a positive integer, got 0"),
    ({"epochs": 2.5}, InvalidArgumentError, "epochs must be a positive integer, got 2.5"),
    ({"batch_size": "64"}, InvalidArgumentError, "batch_size must be a positive integer"),
    ({"num_workers": -1}, InvalidArgumentError, "num_workers must be a positive integer"),
    ({"steps_per_execution": "fast"}, InvalidArgumentError, 'steps_per_execution must be "auto", None or a positive'),
    ({"steps_per_execution": 0}, InvalidArgumentError, "steps_per_execution must be a positive integer, got 0"),
    ({"batch_size": 5}, InvalidArgumentError, "split evenly across 2 replicas .2 workers x 0 GPUs.: use a multiple of 2"),
    ({"num_workers": 3, "batch_size": 6}, ClusterError, "needs 3 task slots at once, but the cluster has 2"),
    ({"communication": {"compression": "int8"}}, InvalidArgumentError,
     "communication\\['compression'\\] must be 'none' or 'fp16' .gradients all-reduced in float16., got 'int8'"),
    ({"communication": {"pack": 1}}, InvalidArgumentError, "communication must be a dict of the exchange's options"),
])
def test_bad_arguments_are_refused_with_the_fix(small_df, overrides, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(")):
        fit(small_df, **overrides)


@pytest.mark.parametrize("frame, error, message", [
    (pd.DataFrame({"pixels": [[0.0] * 64, None], "digit": [1, 2]}), ColumnError, "column 'pixels' has 1 null value"),
    (pd.DataFrame({"pixels": [[0.0] * 64] * 2, "digit": [1.0, None]}), ColumnError, "column 'digit' has 1 null value"),
    (pd.DataFrame({"pixels": [[0.0] * 63 + [None]] * 2, "digit": [1, 2]}), ColumnError, "2 array.s. with null elements"),
    (pd.DataFrame({"pixels": [[0.0] * 64, [0.0] * 60], "digit": [1, 2]}), ColumnError, "arrays of different lengths .60 to 64."),
    (pd.DataFrame({"pixels": [[0.0] * 64], "digit": [1]}), InvalidArgumentError, "has 1 row.s., fewer than num_workers=2"),
])
def test_bad_data_is_refused_before_training(spark, frame, error, message):
    with pytest.raises(error, match=message):
        fit(spark.createDataFrame(frame))


@pytest.mark.parametrize("value", ["soon", "0"])
def test_a_bad_spare_idle_timeout_is_refused(spark, small_df, value):
    spark.conf.set("spark.tfbarrier.spareIdleTimeout", value)
    try:
        with pytest.raises(ClusterError, match="spareIdleTimeout must be a number of seconds above 0, got '"
                                               + value + "'; to turn spares off, set spark.tfbarrier.warmStart"):
            fit(small_df)
    finally:
        spark.conf.unset("spark.tfbarrier.spareIdleTimeout")


@pytest.mark.parametrize("value, tf_keras, options, message", [
    ("sometimes", False, {}, "spark.tfbarrier.encrypt must be 'auto' (encrypt when Spark does) or 'always', "
                             "got 'sometimes'"),
    ("always", True, {"exchange": "strategy", "communication": {"implementation": "ring"}},
     "spark.tfbarrier.encrypt=always is on, but TensorFlow's gRPC traffic between the workers"),
    ("always", True, {"exchange": "strategy", "communication": {"implementation": "nccl"}},
     "spark.tfbarrier.encrypt=always is on"),
    # allowed, or over tfbarrier's ring (the default there): what stops this empty frame's fit comes after
    ("always", True, {"exchange": "strategy", "allow_unencrypted": True}, None),
    ("always", True, {}, None),
])
def test_encrypt_always_refuses_what_tensorflow_carries_in_the_clear_unless_allowed(spark, small_df, value, tf_keras,
                                                                                     options, message):
    from conftest import worker_model

    model = worker_model(digits_cnn()) if tf_keras else digits_cnn()
    spark.conf.set("spark.tfbarrier.encrypt", value)
    try:
        with pytest.raises(tfbarrier.errors.TfBarrierError) as caught:
            fit(small_df.limit(0), model, **options)
    finally:
        spark.conf.unset("spark.tfbarrier.encrypt")
    assert str(caught.value).startswith(message or "the DataFrame is empty"), caught.value
    if message and value == "always":
        assert "Leave a fit's exchange at 'auto' or 'tfbarrier'" in str(caught.value)  # the fix


def test_an_empty_dataframe_is_refused(small_df):
    with pytest.raises(InvalidArgumentError, match="the DataFrame is empty"):
        fit(small_df.limit(0))


def test_an_unknown_keyword_names_the_closest_argument(small_df):
    with pytest.raises(InvalidArgumentError, match=r"unknown argument\(s\) 'epoch' \(did you mean 'epochs'\?\)"):
        fit(small_df, epoch=3)


def test_a_model_function_that_cannot_be_pickled_is_refused(small_df):
    import threading

    lock = threading.Lock()

    def build():
        with lock:
            return digits_cnn()

    with pytest.raises(ModelError, match="the model function cannot be pickled"):
        fit(small_df, build)


def test_callbacks_must_be_a_function(small_df):
    with pytest.raises(InvalidArgumentError, match="callbacks must be a function of no arguments"):
        fit(small_df, callbacks=[1])


def test_r_style_whole_floats_are_accepted_as_integers():
    from tfbarrier.checks import positive_int

    assert positive_int("epochs", 3.0) == 3


def test_data_must_be_a_spark_dataframe():
    with pytest.raises(InvalidArgumentError, match="data must be a Spark DataFrame, got DataFrame"):
        fit(pd.DataFrame({"pixels": [[0.0] * 64], "digit": [1]}))


def test_uncompiled_model_is_refused(small_df):
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    with pytest.raises(ModelError, match=r"not compiled: call model\.compile\(optimizer="):
        fit(small_df, model)


def test_a_model_of_two_inputs_fed_one_column_is_refused_naming_its_inputs(small_df):
    import keras

    a, b = keras.Input((32,), name="left"), keras.Input((32,), name="right")
    model = keras.Model([a, b], keras.layers.Dense(10)(keras.layers.Concatenate()([a, b])))
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ModelError, match=r'2 inputs: give features= one column for each.*\{"left": "<column>", '
                                         r'"right": "<column>"\}'):
        fit(small_df, model)


def test_a_keras3_model_tf_keras_cannot_rebuild_takes_the_native_path_and_others_the_translated_one():
    import keras

    from tfbarrier.models.native_model import spec_for_fit
    from tfbarrier.spark.transfer import JobFiles

    class Doubling(keras.layers.Layer):
        def call(self, x):
            return 2 * x

    def compiled(*layers):
        model = keras.Sequential([keras.Input((64,)), *layers, keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss="mse")
        return model

    with JobFiles() as files:
        assert getattr(spec_for_fit(compiled(Doubling()), files), "native", False)
        assert not getattr(spec_for_fit(compiled(), files), "native", False)
        assert getattr(spec_for_fit(compiled(), files, "native"), "native", False)
        with pytest.raises(ModelError, match="cannot be loaded by tf_keras"):
            spec_for_fit(compiled(Doubling()), files, "translated")
        with pytest.raises(InvalidArgumentError, match="keras3Training is 'fast': set it to one of auto, native"):
            spec_for_fit(compiled(), files, "fast")


def test_neither_model_nor_function_is_refused(small_df):
    with pytest.raises(ModelError, match="must be a compiled Keras model or a function"):
        fit(small_df, model=42)
