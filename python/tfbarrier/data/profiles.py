"""The driver's one look at the data before a fit: an aggregate pass over the training columns (``profile``, one
Spark job) and what it refuses (``check_profile``), naming the column and the fix. What the feature columns must
hold is their layout's to say (features.py), here and again in the tasks, on the shard they wrote (a plain Parquet
scan is checked there, row by row). And ``validation_arguments``: a validation DataFrame has the training columns.
"""

from tfbarrier import checks
from tfbarrier.data.layouts import layout as features_layout
from tfbarrier.errors import ColumnError, InvalidArgumentError


def profile(df, layout):
    """One aggregate pass over the training columns: rows, the partitions that hold any
    (``nonempty_partitions``), nulls per column, and what the layout measures (features.py)."""
    from pyspark.sql import functions as F

    partition = "__tfbarrier_partition"  # projected first: Spark refuses it inside an aggregate
    aggregates = [F.count(F.lit(1)).alias("rows"), F.count_distinct(partition).alias("nonempty_partitions")]
    aggregates += [F.count_if(F.col(name).isNull()).alias(f"nulls_{i}") for i, name in enumerate(layout.columns)]
    aggregates += layout.aggregates() + layout.sequence_aggregates()
    return df.withColumn(partition, F.spark_partition_id()).agg(*aggregates).collect()[0].asDict()


def check_profile(profile, layout, num_workers, input_shape, what="the DataFrame"):
    """Refuse data the workers could not train on (or, ``what``, validate on), naming the column and the fix."""
    rows = profile["rows"]
    if rows == 0:
        raise InvalidArgumentError(f"{what} is empty: there is nothing to " +
                                   ("train on" if what == "the DataFrame" else "validate on"))
    if rows < num_workers:
        raise InvalidArgumentError(
            f"the DataFrame has {rows} row(s), fewer than num_workers={num_workers}: every worker needs rows "
            f"of its own; use num_workers <= {rows}"
        )
    for i, name in enumerate(layout.columns):
        nulls = profile[f"nulls_{i}"]
        if nulls:
            raise ColumnError(
                f"column {name!r}{'' if what == 'the DataFrame' else ' of ' + what} has {nulls} null value(s): "
                "drop or impute them first, e.g. "
                f"df.dropna(subset={layout.columns!r})"
            )
    layout.check_sequences(profile)
    layout.check_profile(profile, input_shape)


def validation_arguments(validation_data, validation_split, validation_freq, features, label, weight=None):
    """(validation_data with the training columns, validation_split as a float or None, validation_freq)."""
    if validation_data is not None and validation_split is not None:
        raise InvalidArgumentError("pass validation_data or validation_split, not both")
    if validation_data is not None:
        validation_data = checks.spark_dataframe(validation_data, "validation_data")
        features_layout(validation_data.schema, features, label, weight=weight)  # the same columns, usable types
    if validation_split is not None:
        if isinstance(validation_split, bool) or not isinstance(validation_split, (int, float)) \
                or not 0 < validation_split < 1:
            raise InvalidArgumentError(f"validation_split must be a fraction between 0 and 1, got {validation_split!r}")
        validation_split = float(validation_split)
    return validation_data, validation_split, checks.positive_int("validation_freq", validation_freq)
