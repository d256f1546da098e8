"""predict(): scoring a Spark DataFrame on the executors."""

import multiprocessing
import os
import threading
import time

import numpy as np
import pandas as pd
import pytest
from conftest import digits_cnn, model_loads, partitioned

import tfbarrier
from tfbarrier.errors import ColumnError, InvalidArgumentError, ModelError


@pytest.fixture(scope="module")
def model():
    """A quickly trained digits model (local Keras 3 fit: predict is what is tested here)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    net = digits_cnn()
    net.fit((x / 16.0).reshape(-1, 8, 8, 1), y, epochs=2, batch_size=64, verbose=0)
    return net


@pytest.fixture(scope="module")
def rows(digits):
    frame = digits[0].iloc[:600].reset_index(drop=True)
    frame["row_id"] = np.arange(len(frame))
    return frame


def local_outputs(model, frame):
    x = np.stack(frame["pixels"].to_numpy()).reshape(-1, 8, 8, 1).astype("float32")
    logits = model.predict(x, verbose=0)
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    return logits, probabilities / probabilities.sum(axis=1, keepdims=True)


@pytest.mark.versions
def test_classes_and_probabilities_on_4_partitions_match_local_predict(spark, model, rows):
    df = spark.createDataFrame(rows).repartition(4)
    classes = tfbarrier.predict(df, model, features="pixels", batch_size=64).toPandas().sort_values("row_id")
    probs = tfbarrier.predict(df, model, features="pixels", output="probabilities",
                              output_col="p").toPandas().sort_values("row_id")
    logits, expected = local_outputs(model, rows)
    assert (classes["prediction"].to_numpy() == np.argmax(logits, axis=1)).all()
    np.testing.assert_allclose(np.stack(probs["p"].to_numpy()), expected, atol=1e-5)
    assert list(classes.columns) == ["pixels", "digit", "row_id", "prediction"]
    assert (classes["digit"].to_numpy() == rows["digit"].to_numpy()).all()  # every input column kept


def test_raw_outputs_are_the_models_outputs(spark, model, rows):
    scored = tfbarrier.predict(spark.createDataFrame(rows.iloc[:50]), model, features="pixels", output="raw")
    raw = np.stack(scored.toPandas().sort_values("row_id")["prediction"].to_numpy())
    np.testing.assert_allclose(raw, local_outputs(model, rows.iloc[:50])[0], rtol=1e-4, atol=1e-5)


def test_row_order_within_partitions_is_kept(spark, model, rows):
    df = spark.createDataFrame(rows).coalesce(2)
    before = [r["row_id"] for r in df.select("row_id").collect()]
    after = [r["row_id"] for r in tfbarrier.predict(df, model, features="pixels", batch_size=7).select("row_id").collect()]
    assert after == before


def test_empty_partitions_and_partitions_smaller_than_a_batch(spark, model, rows):
    small = rows.iloc[:10]
    df = partitioned(spark, small, lambda i: 2 * (i % 3), 6)  # rows in partitions 0, 2, 4; 1, 3, 5 empty
    assert df.rdd.glom().map(len).collect() == [4, 0, 3, 0, 3, 0]
    scored = tfbarrier.predict(df, model, features="pixels").toPandas().sort_values("row_id")
    assert len(scored) == 10
    assert (scored["prediction"].to_numpy() == np.argmax(local_outputs(model, small)[0], axis=1)).all()
    empty = spark.createDataFrame(small).limit(0)
    assert tfbarrier.predict(empty, model, features="pixels").count() == 0


def test_model_is_loaded_once_per_python_worker_not_per_batch(spark, model, rows, tmp_path):
    with model_loads(spark, tmp_path / "loads.log") as loaders:
        df = spark.createDataFrame(rows).repartition(4)
        scored = tfbarrier.predict(df, model, features="pixels", batch_size=16)  # 600 rows: ~40 batches
        first = scored.toPandas().sort_values("row_id")
        second = scored.toPandas().sort_values("row_id")  # a second job reuses the Python workers' cached model
        pids = loaders()
    assert 1 <= len(pids) <= 2  # local[2]: at most two Python workers, one load each
    assert len(set(pids)) == len(pids)
    expected = np.argmax(local_outputs(model, first)[0], axis=1)
    assert len(first) == len(rows) and (first["prediction"].to_numpy() == expected).all()
    assert (second["prediction"].to_numpy() == expected).all()


def test_a_fit_result_can_be_scored_directly(spark, digits_df):
    result = tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit",
                           epochs=1, batch_size=64, num_workers=2)
    scored = tfbarrier.predict(digits_df.limit(20), result, features="pixels", output_col="digit_hat").toPandas()
    expected = np.argmax(local_outputs(result.model, scored)[0], axis=1)  # the returned model, scored here
    assert len(scored) == 20 and (scored["digit_hat"].to_numpy() == expected).all()


@pytest.mark.parametrize("layer", ["first, by name", -2])
def test_features_are_the_layers_outputs_as_a_local_truncated_model_gives(spark, model, rows, layer):
    import keras

    layer = model.layers[0].name if layer == "first, by name" else layer  # conv2d, conv2d_7...: Keras numbers names

    small = rows.iloc[:10]
    df = partitioned(spark, small, lambda i: 2 * (i % 2), 3)  # partition 1 empty
    scored = tfbarrier.predict(df, model, features="pixels", output="features", layer=layer, output_col="f")
    features = np.stack(scored.toPandas().sort_values("row_id")["f"].to_numpy())
    chosen = model.get_layer(layer) if isinstance(layer, str) else model.layers[layer]
    truncated = keras.Model(model.inputs[0], chosen.output)  # a Sequential's .input: never called
    x = np.stack(small["pixels"].to_numpy()).reshape(-1, 8, 8, 1).astype("float32")
    expected = truncated.predict(x, verbose=0).reshape(len(small), -1)
    assert features.shape == expected.shape == (10, 6 * 6 * 32 if isinstance(layer, str) else 64)
    np.testing.assert_allclose(features, expected, atol=1e-5)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"output": "features", "layer": "nope"}, InvalidArgumentError, "the model has no layer 'nope': its layers are"),
    ({"output": "features", "layer": 9}, InvalidArgumentError, "the model has no layer 9"),
    ({"features": "nope"}, ColumnError, "column 'nope' is not in the DataFrame"),
    ({"output_col": "digit"}, ColumnError, "output_col 'digit' must be a new column name"),
    ({"output": "labels"}, InvalidArgumentError, "output must be one of"),
    ({"batch_size": 0}, InvalidArgumentError, "batch_size must be a positive integer"),
    ({"features": ["digit"]}, ModelError, "each row has 1 feature values"),
])
def test_bad_arguments_are_refused_on_the_driver(spark, model, rows, kwargs, error, message):
    args = {"features": "pixels", **kwargs}
    with pytest.raises(error, match=message):
        tfbarrier.predict(spark.createDataFrame(rows.iloc[:5]), model, **args)


def test_wrong_array_length_fails_with_the_column_error(spark, model):
    df = spark.createDataFrame(pd.DataFrame({"pixels": [[0.0] * 10] * 3}))
    with pytest.raises(Exception, match="each row has 10 feature values"):
        tfbarrier.predict(df, model, features="pixels").collect()


def test_predict_local_matches_keras_and_distributed_outputs(model, rows):
    from tfbarrier.predicting.inference import predict_local

    x = np.stack(rows["pixels"].to_numpy())[:50]
    logits, probabilities = local_outputs(model, rows.iloc[:50])
    assert (predict_local(model, x) == np.argmax(logits, axis=1)).all()
    np.testing.assert_allclose(predict_local(model, x, output="probabilities"), probabilities, atol=1e-5)
    with pytest.raises(ModelError, match="each row has 3 feature values"):
        predict_local(model, x[:, :3])


def test_predict_local_reads_a_dataframe_with_the_feature_layouts(model, rows):
    """tfbarrier.predict_local on a pandas DataFrame (or R's dict of columns) reads its feature columns with
    features.py's layouts, as predict's tasks do: an array column, numeric columns, encoded images."""
    import tensorflow as tf

    x = np.stack(rows["pixels"].to_numpy())[:20].astype(np.float32)
    expected = tfbarrier.predict_local(model, x, output="raw")
    frame = pd.DataFrame({"pixels": list(x), "digit": rows["digit"].iloc[:20]})
    np.testing.assert_array_equal(tfbarrier.predict_local(model, frame, features="pixels", output="raw"), expected)
    np.testing.assert_array_equal(tfbarrier.predict_local(model, {"pixels": x}, output="raw"), expected)
    columns = {f"x{i}": x[:, i] for i in range(64)}
    np.testing.assert_array_equal(tfbarrier.predict_local(model, pd.DataFrame(columns), features=list(columns),
                                                          output="raw"), expected)
    images = (x.reshape(-1, 8, 8, 1) * 255).round().astype(np.uint8)
    encoded = [tf.io.encode_png(image).numpy() for image in images]
    decoded = np.stack([tf.image.resize(tf.io.decode_png(data, 1), (8, 8)).numpy() for data in encoded])
    np.testing.assert_allclose(tfbarrier.predict_local(model, pd.DataFrame({"content": encoded}), output="raw"),
                               model.predict(decoded, verbose=0), atol=1e-4)
    with pytest.raises(ColumnError, match="holds arrays of different lengths"):
        tfbarrier.predict_local(model, {"pixels": [x[0], x[1, :10]]})
    with pytest.raises(ColumnError, match="column 'image' is not in the DataFrame"):
        tfbarrier.predict_local(model, frame, features="image")



def _prune_in_rounds(barrier, directory, rounds, failures):
    from tfbarrier.predicting.scoring_models import prune_models
    try:
        for _ in range(rounds):
            barrier.wait()
            prune_models(directory, 2)
            barrier.wait()
    except threading.BrokenBarrierError:
        pass  # another party failed and said why
    except Exception as exc:
        failures.put(f"{type(exc).__name__}: {exc}")
        barrier.abort()


def test_python_workers_pruning_the_hosts_weights_files_at_once_do_not_fail(tmp_path):
    """Python workers of one executor host may prune its weights files at the same moment (CI saw
    FileNotFoundError when two deleted the same old file): none fails and the newest files stay."""
    context = multiprocessing.get_context("spawn")
    workers, rounds = 4, 20
    barrier, failures = context.Barrier(workers + 1, timeout=120), context.Queue()
    processes = [context.Process(target=_prune_in_rounds, args=(barrier, str(tmp_path), rounds, failures))
                 for _ in range(workers)]
    for process in processes:
        process.start()
    try:
        for round_ in range(rounds):
            for i in range(100):
                path = tmp_path / f"{round_}-{i:03}.safetensors"
                path.write_bytes(b"w")
                os.utime(path, (time.time() - 10_000 + round_ * 100 + i,) * 2)
            barrier.wait()  # the workers prune
            barrier.wait()
            assert sorted(p.name for p in tmp_path.iterdir()) == [f"{round_}-098.safetensors",
                                                                  f"{round_}-099.safetensors"]
    except threading.BrokenBarrierError:
        pass  # a worker failed: the assertion below names its error
    finally:
        for process in processes:
            process.join(60)
    assert failures.empty(), failures.get()


def test_a_model_whose_layer_keeps_its_state_in_assets_scores_as_locally(spark):
    """An adapted IntegerLookup keeps its vocabulary in the .keras archive's assets, which neither the model's
    config nor its weights hold: the executors' copy must be the archive's."""
    import keras

    keras.utils.set_random_seed(4)
    lookup = keras.layers.IntegerLookup()
    lookup.adapt(np.array([7, 11, 13, 7, 11]))
    inputs = keras.Input((1,), dtype="int64")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(lookup.vocabulary_size(), 3)(lookup(inputs)))
    net = keras.Model(inputs, keras.layers.Dense(2)(embedded))
    frame = pd.DataFrame({"code": [7.0, 11.0, 13.0, 99.0, 11.0, 7.0]})
    scored = tfbarrier.predict(spark.createDataFrame(frame).repartition(2), net, features="code",
                               output="raw").toPandas()
    local = net.predict(scored["code"].to_numpy().astype("int64").reshape(-1, 1), verbose=0)
    np.testing.assert_allclose(np.stack(scored["prediction"]), local, rtol=1e-5, atol=1e-6)
