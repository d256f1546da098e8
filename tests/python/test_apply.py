"""apply(): a function per barrier task over its own partition, TF_CONFIG set (what R's
spark_tf_apply() runs an R closure through), and spark_frame() for column arrays."""

import json

import numpy as np
import pandas as pd
import pytest

import tfbarrier
from tfbarrier.errors import ColumnError, WorkerError


def describe(partition, barrier):
    tf_config = json.loads(barrier["tf_config"])
    return pd.DataFrame({
        "partition": [barrier["partition"]],
        "address": [barrier["address"]],
        "rows": [len(partition)],
        "total": [float(partition["x"].sum())],
        "workers": [",".join(tf_config["cluster"]["worker"])],
        "index": [tf_config["task"]["index"]],
    })


def test_apply_runs_once_per_partition_with_tf_config(spark):
    df = spark.createDataFrame(pd.DataFrame({"x": np.arange(10.0)}))
    out = tfbarrier.apply(df, describe, num_workers=2, columns={"partition": "int32", "address": "string",
                                                                   "rows": "int64", "total": "float64",
                                                                   "workers": "string", "index": "int64"})
    assert list(out["partition"]) == [0, 1] and list(out["index"]) == [0, 1]
    assert out["rows"].sum() == 10 and out["total"].sum() == 45.0
    assert out["address"].nunique() == 2
    assert all(set(w.split(",")) == set(out["address"]) for w in out["workers"])
    assert str(out["partition"].dtype) == "int32"


def test_apply_reports_the_functions_error(spark):
    def broken(partition, barrier):
        raise KeyError("no such column")

    df = spark.createDataFrame(pd.DataFrame({"x": np.arange(4.0)}))
    with pytest.raises(WorkerError, match="KeyError"):
        tfbarrier.apply(df, broken, num_workers=2)


def test_apply_names_missing_result_columns(spark):
    df = spark.createDataFrame(pd.DataFrame({"x": np.arange(4.0)}))
    with pytest.raises(ColumnError, match=r"the function's result has no column\(s\) \['y'\]") as caught:
        tfbarrier.apply(df, lambda p, b: pd.DataFrame({"x": [1]}), num_workers=2, columns={"y": "int32"})
    assert caught.value.worker in (0, 1)  # raised in a training process, with its class


def test_spark_frame_builds_array_and_scalar_columns(spark):
    pixels = np.asfortranarray(np.arange(12.0).reshape(3, 4))  # R matrices arrive column-major
    df = tfbarrier.spark_frame(spark, {"pixels": pixels, "digit": np.array([7, 8, 9])})
    rows = df.collect()
    assert [r["pixels"] for r in rows] == pixels.tolist() and [r["digit"] for r in rows] == [7, 8, 9]
    with pytest.raises(ColumnError, match="different numbers of rows"):
        tfbarrier.spark_frame(spark, {"a": np.arange(3), "b": np.arange(4)})
