"""Spark DataFrames to and from column arrays, the way R hands data over through reticulate: one
NumPy array per column, 1-D for a scalar column, 2-D for an array column (one row per example, e.g. a
flat image). The data travels as one Arrow table, not row by row."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfbarrier.errors import ColumnError, InvalidArgumentError


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
    return _from_arrow(spark, pa.table(arrays))


def _from_arrow(spark, table):
    """A Spark DataFrame of an Arrow table: as it is on pyspark 4, through pandas with Arrow on pyspark
    3.5 (which takes no Arrow table)."""
    import pyspark

    if int(pyspark.__version__.split(".")[0]) >= 4:
        return spark.createDataFrame(table)
    from pyspark.sql.pandas.types import from_arrow_schema

    key = "spark.sql.execution.arrow.pyspark.enabled"
    before = spark.conf.get(key, "false")
    spark.conf.set(key, "true")
    try:
        return spark.createDataFrame(table.to_pandas(), schema=from_arrow_schema(table.schema))
    finally:
        spark.conf.set(key, before)


def _numpy_column(column):
    """A collected Arrow column as NumPy: 2-D for arrays that all have one length and no nulls, a list
    of 1-D arrays (None for a null) for other arrays, 1-D otherwise (strings as str, nulls as None)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or \
            pa.types.is_fixed_size_list(column.type):
        lengths = pc.unique(pc.list_value_length(column)).to_pylist()
        values = pc.list_flatten(column)
        if len(column) and column.null_count == 0 and values.null_count == 0 and len(lengths) == 1:
            return values.to_numpy(zero_copy_only=False).reshape(len(column), lengths[0])
        return [row.values.to_numpy(zero_copy_only=False) if row.is_valid else None for row in column]
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type):
        if column.null_count == 0:
            return column.to_numpy(zero_copy_only=False)
    return column.to_pylist()


def frame_columns(df):
    """The columns of a Spark DataFrame (classic or Connect) collected to the driver through Arrow, as
    ``{name: values}`` in column order: what R's tf_collect() turns into a data.frame."""
    table = df.toArrow()
    return {name: _numpy_column(table.column(name)) for name in table.column_names}


def vectors_as_arrays(df):
    """``df`` with its Spark ML vector columns as arrays of doubles (``vector_to_array``), other columns as
    they are: what crosses R's exchange directory (Spark 4.3 fails an Arrow UDF, such as predict's, over a
    vector column its vectorized Parquet reader read: UNSUPPORTED_DATATYPE UDT)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F

    return df.select(*[vector_to_array(F.col(field.name)).alias(field.name) if isinstance(field.dataType, VectorUDT)
                       else F.col(field.name) for field in df.schema.fields])
