"""Keras 3 models built on the driver load in tf_keras with the same weights and outputs."""

import numpy as np
import pytest
from conftest import worker_model



def _sequential():
    import keras

    return keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(8, kernel_regularizer=keras.regularizers.L2(1e-4)),
        keras.layers.Dropout(0.2), keras.layers.BatchNormalization(), keras.layers.Dense(3),
    ])


def _functional():
    import keras

    inputs = keras.Input((6,), name="x")
    left = keras.layers.Dense(4, activation="relu")(inputs)
    right = keras.layers.Dense(4, activation="tanh")(inputs)
    outputs = keras.layers.Dense(2, activation="softmax")(keras.layers.Concatenate()([left, right]))
    return keras.Model(inputs, outputs)


def _recurrent():
    import keras

    return keras.Sequential([keras.Input((5,)), keras.layers.Embedding(20, 4), keras.layers.LSTM(3), keras.layers.Dense(1)])


@pytest.mark.parametrize("make", [_sequential, _functional, _recurrent])
def test_keras3_model_rebuilds_in_tf_keras_with_identical_predictions(make):
    import keras

    model = make()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse", metrics=["mae"])
    rebuilt = worker_model(model)
    if make is _recurrent:
        x = np.random.default_rng(0).integers(0, 20, (4, 5))
    else:
        x = np.random.default_rng(0).random((4, *model.input_shape[1:]), dtype="float32")
    np.testing.assert_allclose(rebuilt.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    assert type(rebuilt).__module__.startswith("tf_keras")
    assert type(rebuilt.optimizer).__name__ == "SGD"
    assert rebuilt.optimizer.get_config()["momentum"] == pytest.approx(0.9)


@pytest.mark.parametrize("optimizer", ["Adam", "AdamW", "RMSprop", "Adagrad", "Nadam"])
def test_built_in_optimizers_keep_their_settings(optimizer):
    import keras

    model = _functional()
    model.compile(optimizer=getattr(keras.optimizers, optimizer)(learning_rate=0.0123), loss="mse")
    rebuilt = worker_model(model)
    assert type(rebuilt.optimizer).__name__ == optimizer
    assert float(rebuilt.optimizer.learning_rate) == pytest.approx(0.0123)


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_weights_written_and_read_in_slices_of_a_few_rows_come_back_equal(flavor, tmp_path, monkeypatch):
    import importlib

    from tfbarrier.models import weights_file

    keras = importlib.import_module(flavor)
    monkeypatch.setattr(weights_file, "WEIGHTS_CHUNK", 3 * 7 * 4)  # the 10 x 7 kernel goes in 3, 3, 3 and 1 rows

    def make(initializer):
        return keras.Sequential([keras.Input((10,)), keras.layers.Dense(7, kernel_initializer=initializer,
                                                                        bias_initializer=initializer)])

    written, read = make("glorot_uniform"), make("zeros")
    written.layers[0].bias.assign(np.arange(7, dtype="float32"))
    path = str(tmp_path / "w.safetensors")
    weights_file.write_weights(written.weights, path)
    weights_file.read_weights(path, read.weights, lambda variable: [weights_file.tf_variable(variable)])
    for mine, theirs in zip(read.weights, written.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))



@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_weights_read_leave_every_variable_read_in_place_not_copied(flavor, tmp_path, monkeypatch):
    """A weight read from a weights file larger than WEIGHTS_CHUNK was assigned in slices of rows
    (ResourceStridedSliceAssign), which left TensorFlow's variable copying all of itself at every read and update
    (copy-on-read mode): each step of a fit held a copy of every such weight (bench/README.md). Two reads of a
    variable now share its memory, as a fresh variable's do."""
    import importlib

    from tfbarrier.models import weights_file

    keras = importlib.import_module(flavor)
    monkeypatch.setattr(weights_file, "WEIGHTS_CHUNK", 3 * 7 * 4)  # a kernel of 10 x 7: more than a slice

    def make():
        return keras.Sequential([keras.Input((10,)), keras.layers.Dense(7, kernel_initializer="glorot_uniform")])

    def shared(variable):
        """Whether two reads of ``variable`` in a traced function are its own memory (eager reads are copied)."""
        import tensorflow as tf

        @tf.function
        def reads():
            first, second = (tf.raw_ops.ReadVariableOp(resource=variable.handle, dtype=variable.dtype) for _ in "12")
            return tf.numpy_function(lambda a, b: np.array(a.ctypes.data == b.ctypes.data), [first, second], tf.bool)

        return bool(reads())

    written, read = make(), make()
    path = str(tmp_path / "w.safetensors")
    weights_file.write_weights(written.weights, path)
    variables = [weights_file.tf_variable(variable) for variable in read.weights]
    assert all(shared(v) for v in variables)  # a fresh variable's reads share its memory
    weights_file.read_weights(path, read.weights, lambda variable: [weights_file.tf_variable(variable)])
    copied = [v.name for v in variables if not shared(v)]
    assert not copied, f"reading {copied} copies them: left in copy-on-read mode"
    for mine, theirs in zip(read.weights, written.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))

def test_bfloat16_weights_are_written_and_read_back_equal(tmp_path, monkeypatch):
    """KerasHub's presets load in bfloat16, which NumPy knows only through ml_dtypes (no buffer format)."""
    import keras

    from tfbarrier.models import weights_file

    monkeypatch.setattr(weights_file, "WEIGHTS_CHUNK", 3 * 7 * 2)  # the kernel in slices of 3 rows too

    def make(initializer):
        return keras.Sequential([keras.Input((10,)), keras.layers.Dense(7, kernel_initializer=initializer,
                                                                        dtype="bfloat16")])

    written, read = make("glorot_uniform"), make("zeros")
    path = str(tmp_path / "w.safetensors")
    digest = weights_file.write_weights(written.weights, path)
    weights_file.read_weights(path, read.weights, lambda variable: [weights_file.tf_variable(variable)])
    assert weights_file.write_weights(read.weights) == digest
    for mine, theirs in zip(read.weights, written.weights, strict=True):
        assert mine.dtype == "bfloat16"
        np.testing.assert_array_equal(np.asarray(mine, "float32"), np.asarray(theirs, "float32"))
