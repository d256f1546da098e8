"""Spark DataFrames from column arrays, the way R hands data over through reticulate: one NumPy array
per column, 1-D for a scalar column, 2-D for an array column (one row per example, e.g. a flat
image). The data travels as one Arrow table, not row by row."""

import numpy as np
import pyarrow as pa

from .errors import ColumnError, InvalidArgumentError


def _arrow_column(name, values):
    array = np.asarray(values)
    if array.ndim == 1:
        return pa.array(array)
    if array.ndim == 2:
        rows, width = array.shape
        offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * width)
        return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(array).reshape(-1)))
    raise ColumnError(f"column {name!r} has {array.ndim} dimensions; give 1 (values) or 2 (one array per row)")


def spark_frame(spark, columns):
    """A Spark DataFrame from ``{name: array}``; every array must have the same number of rows."""
    if not isinstance(columns, dict) or not columns:
        raise InvalidArgumentError("columns must be a non-empty dict of column name -> array")
    arrays = {name: _arrow_column(name, values) for name, values in columns.items()}
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ColumnError(f"columns have different numbers of rows: {lengths}")
    return spark.createDataFrame(pa.table(arrays))
