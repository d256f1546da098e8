"""Checks made on the driver before any cluster work: arguments, columns, shapes."""

import math
import numbers

from .errors import ColumnError, InvalidArgumentError, ModelError
from .shards import Layout


def positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    # R numbers reach Python as floats: accept 3.0, refuse 3.5, True, "3".
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def spark_dataframe(data):
    from pyspark.sql import DataFrame

    if not isinstance(data, DataFrame):
        raise InvalidArgumentError(
            f"data must be a Spark DataFrame, got {type(data).__name__}: convert it first, e.g. "
            "spark.createDataFrame(pandas_df)"
        )
    return data


def _is_numeric(data_type):
    from pyspark.sql.types import BooleanType, NumericType

    return isinstance(data_type, NumericType) and not isinstance(data_type, BooleanType)


def layout(schema, features, label=None, scoring=False):
    """The Layout of the training columns (``scoring``: the feature columns alone), or a ColumnError
    naming the column and the fix."""
    from pyspark.sql.types import ArrayType

    if isinstance(features, str):
        features = [features]
    if not features or not all(isinstance(f, str) for f in features):
        raise InvalidArgumentError("features must be a column name or a non-empty list of column names")
    if not scoring and not isinstance(label, str):
        raise InvalidArgumentError(f"label must be a column name, got {label!r}")
    types = {field.name: field.dataType for field in schema.fields}
    for name in [*features] + ([] if scoring else [label]):
        if name not in types:
            raise ColumnError(f"column {name!r} is not in the DataFrame; its columns are {sorted(types)}")
    if not scoring and not _is_numeric(types[label]):
        raise ColumnError(
            f"label column {label!r} has type {types[label].simpleString()}; it must be numeric "
            "(class ids as integers, or a float target): cast or index it first"
        )
    array_column = len(features) == 1 and isinstance(types[features[0]], ArrayType)
    if array_column:
        element = types[features[0]].elementType
        if not _is_numeric(element):
            raise ColumnError(
                f"feature column {features[0]!r} is an array of {element.simpleString()}; it must hold numbers"
            )
    else:
        for name in features:
            if not _is_numeric(types[name]):
                raise ColumnError(
                    f"feature column {name!r} has type {types[name].simpleString()}; features must be "
                    "numeric columns or one array column of numbers"
                )
    return Layout(features=tuple(features), label=None if scoring else label, array_column=array_column)


def feature_width(df, layout):
    """Values per row: the number of feature columns, or the length of the first row's array."""
    if not layout.array_column:
        return len(layout.features)
    from pyspark.sql import functions as F

    first = df.select(F.size(layout.features[0]).alias("n")).limit(1).collect()
    return first[0]["n"] if first else None


def check_input_width(width, input_shape):
    """Refuse data whose rows do not fill the model's per-sample input shape."""
    if width is None or input_shape is None or None in input_shape:
        return
    needed = math.prod(input_shape)
    if width != needed:
        raise ModelError(
            f"each row has {width} feature values but the model's input shape {tuple(input_shape)} needs "
            f"{needed}: choose the matching feature columns or change the model's input"
        )


def global_batch(batch_size, num_workers):
    if batch_size % num_workers:
        raise InvalidArgumentError(
            f"batch_size={batch_size} is the global batch, split evenly across the {num_workers} workers: "
            f"use a multiple of num_workers (e.g. {batch_size - batch_size % num_workers or num_workers})"
        )
    return batch_size
