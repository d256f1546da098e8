"""Spark ML vector columns (VectorAssembler's, StandardScaler's, sparklyr's ft_* output) as features:
they train and score exactly as the same values in an array column."""

import keras
import numpy as np
import pandas as pd
import pytest
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.functions import array_to_vector
from pyspark.ml.linalg import SparseVector, Vectors, VectorUDT
from pyspark.sql.types import ArrayType, DoubleType, LongType, StructField, StructType

import tfbarrier
from tfbarrier.data import features, layouts, parquet_source
from tfbarrier.errors import ColumnError
from tfbarrier.predicting.inference import predict_local

FIT = dict(label="digit", num_workers=2, epochs=2, batch_size=32, seed=3, verbose=0)


def softmax_model(width, classes=10, learning_rate=0.1):
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(classes, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="sparse_categorical_crossentropy")
    return model


@pytest.fixture(scope="module")
def digits_vectors(digits_df):
    """The digits with their pixels both as an array column and as a dense vector column."""
    return digits_df.withColumn("vector", array_to_vector("pixels")).cache()


@pytest.fixture(scope="module")
def sparse_rows(spark):
    """Rows of 8 values, mostly zeros, as a sparse vector column and as an array column."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(96):
        dense = np.where(rng.random(8) < 0.7, 0.0, rng.random(8))
        nonzero = np.flatnonzero(dense)
        rows.append((Vectors.sparse(8, nonzero.tolist(), dense[nonzero].tolist()), dense.tolist(), i % 3))
    schema = StructType([StructField("vector", VectorUDT()), StructField("pixels", ArrayType(DoubleType())),
                         StructField("digit", LongType())])
    return spark.createDataFrame(rows, schema).repartition(2).cache()


def same_weights(first, second):
    return all(np.array_equal(a, b) for a, b in zip(first.model.get_weights(), second.model.get_weights()))


def test_a_dense_vector_column_trains_exactly_as_the_array_column(digits_vectors):
    model = softmax_model(64)  # both fits start from its weights
    as_vector = tfbarrier.fit(digits_vectors, model, features="vector", **FIT)
    as_array = tfbarrier.fit(digits_vectors, model, features="pixels", **FIT)
    assert as_vector.history["loss"][-1] < as_vector.history["loss"][0]
    assert same_weights(as_vector, as_array)


def test_a_sparse_vector_column_trains_exactly_as_its_dense_values(sparse_rows):
    assert isinstance(sparse_rows.first()["vector"], SparseVector)
    model = softmax_model(8, 3)
    as_vector = tfbarrier.fit(sparse_rows, model, features="vector", **FIT)
    as_array = tfbarrier.fit(sparse_rows, model, features="pixels", **FIT)
    assert same_weights(as_vector, as_array)


def test_vector_assembler_output_trains_validates_and_scores(spark, digits):
    """The Spark ML path end to end: VectorAssembler's column in fit (with validation_data) and predict."""
    names = [f"p{i}" for i in range(64)]
    train, held = (spark.createDataFrame(pd.DataFrame(np.stack(frame["pixels"]), columns=names)
                                         .assign(digit=frame["digit"]))
                   for frame in digits)
    assembler = VectorAssembler(inputCols=names, outputCol="assembled")
    train, held = assembler.transform(train), assembler.transform(held)
    result = tfbarrier.fit(train, softmax_model(64), features="assembled", validation_data=held, **FIT)
    assert len(result.history["val_loss"]) == 2
    scored = tfbarrier.predict(held, result, features="assembled").toPandas()
    expected = predict_local(result.model, np.stack(digits[1]["pixels"]))
    assert (scored["prediction"].to_numpy() == expected).all()


def test_predict_scores_a_vector_column_as_the_array_column(digits_vectors):
    model = softmax_model(64)
    for output in ("class", "probabilities", "features"):
        scored = [np.stack(tfbarrier.predict(digits_vectors, model, features=column, output=output, layer=0)
                           .select("prediction").toPandas()["prediction"])
                  for column in ("vector", "pixels")]
        assert np.array_equal(*scored), output


def test_tune_ranks_trials_on_a_vector_column(digits_vectors):
    search = tfbarrier.tune(digits_vectors, lambda params: softmax_model(64, learning_rate=params["learning_rate"]),
                            {"learning_rate": [0.0, 0.1]}, features="vector", label="digit", metric="loss",
                            epochs=2, batch_size=32, verbose=0)
    assert list(search.trials["status"]) == ["ok", "ok"] and search.best_params == {"learning_rate": 0.1}


def test_vectors_of_another_size_than_the_model_takes_are_refused_naming_both(spark, digits_vectors):
    with pytest.raises(ColumnError, match=r"vector column 'vector' has vectors of size 64, but the model takes "
                                          r"10 values per row"):
        tfbarrier.fit(digits_vectors, softmax_model(10), features="vector", **FIT)
    with pytest.raises(Exception, match=r"vector column 'vector' has vectors of size 64, but the model takes 10"):
        tfbarrier.predict(digits_vectors, softmax_model(10), features="vector").collect()


def test_vectors_of_different_sizes_are_refused_with_the_sizes(spark):
    rows = [(Vectors.dense([1.0, 2.0, 3.0]), 0), (Vectors.sparse(4, [1], [1.0]), 1)] * 4
    df = spark.createDataFrame(rows, ["vector", "digit"])
    with pytest.raises(ColumnError, match=r"vector column 'vector' holds vectors of different sizes \(3 to 4\)"):
        tfbarrier.fit(df, softmax_model(3), features="vector", **FIT)


def test_a_parquet_file_of_vectors_trains_through_spark(spark, digits_vectors, tmp_path):
    """Spark ML writes a vector as a struct the direct Parquet read does not decode: Spark streams it."""
    digits_vectors.write.parquet(str(tmp_path / "vectors"))
    df = spark.read.parquet(str(tmp_path / "vectors"))
    layout = layouts.layout(df.schema, "vector", "digit")
    assert isinstance(layout, features.VectorColumn)
    frame = df.select(*layout.projection(spark))
    assert parquet_source.plan(frame, frame.rdd.getNumPartitions(), layout, 2) is None
    result = tfbarrier.fit(df, softmax_model(64), features="vector", **FIT)
    assert result.history["loss"][-1] < result.history["loss"][0]
