"""The driver's checks of the arguments and the data (columns, shapes, values), each raising an error that
names the problem and the fix. All but one run before any cluster work: ``profile`` reads the data in one
Spark job. What the feature columns must hold is their layout's to say (features.py), here and again in
the tasks, on the shard they wrote (a plain Parquet scan is checked there, row by row)."""

import difflib
import inspect
import numbers
import os

from tfbarrier.data.layouts import layout as features_layout
from tfbarrier.errors import ColumnError, InvalidArgumentError
from tfbarrier.exchange import OLD_RING_SPELLING
from tfbarrier.exchange.base import COMPRESSIONS
from tfbarrier.exchange.strategy import IMPLEMENTATIONS
from tfbarrier.user_code import pickle_user_code


def no_unknown_arguments(function_name, unknown, function):
    """Refuse misspelt keyword arguments with the closest known name (reticulate passes any name)."""
    if not unknown:
        return
    known = [name for name in inspect.signature(function).parameters if name != "unknown"]
    hints = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise InvalidArgumentError(
        f"{function_name}() got unknown argument(s) {', '.join(hints)}; it takes {', '.join(known)}"
    )


def positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    # R numbers reach Python as floats: accept 3.0, refuse 3.5, True, "3".
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def steps_per_execution(value):
    """fit's steps_per_execution: "auto", None (as the model was compiled) or a positive integer."""
    if value is None or value == "auto":
        return value
    if isinstance(value, str):
        raise InvalidArgumentError(f'steps_per_execution must be "auto", None or a positive integer, got {value!r}')
    return positive_int("steps_per_execution", value)


def non_negative_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value) or value < 0:
        raise InvalidArgumentError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def positive_seconds(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise InvalidArgumentError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


def callbacks_function(callbacks):
    """The user's callbacks function, pickled; it runs in the training processes."""
    if callbacks is None:
        return None
    if not callable(callbacks):
        raise InvalidArgumentError(
            "callbacks must be a function of no arguments returning a list of tf.keras callbacks (it is "
            f"called in every training process, where tf.keras is tf_keras), got {type(callbacks).__name__}"
        )
    try:
        return pickle_user_code(callbacks, callbacks)
    except Exception as exc:
        raise InvalidArgumentError(f"the callbacks function cannot be pickled: {exc}") from exc


def verbosity(verbose):
    if isinstance(verbose, bool) or verbose not in (0, 1, 2):
        raise InvalidArgumentError(f"verbose must be 0 (silent), 1 (progress bar) or 2 (also logs), got {verbose!r}")
    return int(verbose)


def directory(name, path):
    """A directory argument, made on the driver when it is a local path."""
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"{name} must be a directory path, got {type(path).__name__}")
    path = os.fspath(path)
    if "://" not in path:
        path = os.path.abspath(path)
        os.makedirs(path, exist_ok=True)
    return path


def output_schema(columns):
    """A pyarrow schema from ``{name: Arrow type name}`` (None stays None)."""
    if columns is None:
        return None
    import pyarrow as pa

    if not isinstance(columns, dict) or not columns:
        raise InvalidArgumentError('columns must be a dict of column name -> type name, e.g. {"result": "string"}')
    fields = []
    for name, type_name in columns.items():
        try:
            fields.append(pa.field(name, pa.type_for_alias(type_name)))
        except (ValueError, TypeError):
            raise InvalidArgumentError(
                f"column {name!r} has unknown type {type_name!r}: use string, int32, int64, float64 or bool"
            ) from None
    return pa.schema(fields)


def spark_dataframe(data, name="data"):
    from pyspark.sql import DataFrame

    if not isinstance(data, DataFrame):
        raise InvalidArgumentError(
            f"{name} must be a Spark DataFrame, got {type(data).__name__}: convert it first, e.g. "
            "spark.createDataFrame(pandas_df)"
        )
    return data


def profile(df, layout):
    """One aggregate pass over the training columns: rows, the partitions that hold any
    (``nonempty_partitions``), nulls per column, and what the layout measures (features.py)."""
    from pyspark.sql import functions as F

    partition = "__tfbarrier_partition"  # projected first: Spark refuses it inside an aggregate
    aggregates = [F.count(F.lit(1)).alias("rows"), F.count_distinct(partition).alias("nonempty_partitions")]
    aggregates += [F.count_if(F.col(name).isNull()).alias(f"nulls_{i}") for i, name in enumerate(layout.columns)]
    aggregates += layout.aggregates() + layout.sequence_aggregates()
    return df.withColumn(partition, F.spark_partition_id()).agg(*aggregates).collect()[0].asDict()


def class_weights(class_weight):
    """``class_weight`` as {class id: weight}; R's names arrive as strings ("0")."""
    if class_weight is None:
        return None
    try:
        weights = {int(key): float(value) for key, value in dict(class_weight).items()}
        ok = weights and all(key >= 0 and value >= 0 and str(key) == str(raw).strip()
                             for (key, value), raw in zip(weights.items(), dict(class_weight)))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise InvalidArgumentError(f"class_weight must map class ids (integers >= 0) to weights >= 0, e.g. "
                                   f"{{0: 1.0, 1: 5.0}}; got {class_weight!r}")
    return weights


def validation_arguments(validation_data, validation_split, validation_freq, features, label, weight=None):
    """(validation_data with the training columns, validation_split as a float or None, validation_freq)."""
    if validation_data is not None and validation_split is not None:
        raise InvalidArgumentError("pass validation_data or validation_split, not both")
    if validation_data is not None:
        validation_data = spark_dataframe(validation_data, "validation_data")
        features_layout(validation_data.schema, features, label, weight=weight)  # the same columns, usable types
    if validation_split is not None:
        if isinstance(validation_split, bool) or not isinstance(validation_split, (int, float)) \
                or not 0 < validation_split < 1:
            raise InvalidArgumentError(f"validation_split must be a fraction between 0 and 1, got {validation_split!r}")
        validation_split = float(validation_split)
    return validation_data, validation_split, positive_int("validation_freq", validation_freq)


COMMUNICATION_KEYS = {"bytes_per_pack": "a non-negative int (0: every gradient in one pack)",
                      "timeout_seconds": "seconds, > 0", "compression": " or ".join(map(repr, COMPRESSIONS)),
                      "implementation": "the strategy's 'auto', 'ring' or 'nccl'"}


def communication(options):
    """fit's ``communication``: the exchange's options (tfbarrier.exchange), each checked here; which ones
    the chosen exchange takes, it checks itself. ``implementation`` may still be the ring's old spelling
    ("tfbarrier"), which tfbarrier.exchange.requested turns into ``exchange=``."""
    if options is None:
        return None
    if not isinstance(options, dict) or set(options) - set(COMMUNICATION_KEYS):
        takes = "; ".join(f"{k}: {v}" for k, v in COMMUNICATION_KEYS.items())
        raise InvalidArgumentError(f"communication must be a dict of the exchange's options ({takes}), got {options!r}")
    options = dict(options)
    if "bytes_per_pack" in options:
        options["bytes_per_pack"] = non_negative_int("communication['bytes_per_pack']", options["bytes_per_pack"])
    if "timeout_seconds" in options:
        options["timeout_seconds"] = positive_seconds("communication['timeout_seconds']", options["timeout_seconds"])
    if options.get("implementation", "auto") not in (*IMPLEMENTATIONS, OLD_RING_SPELLING):
        raise InvalidArgumentError(f"communication['implementation'] must be {COMMUNICATION_KEYS['implementation']}, "
                                   f"got {options['implementation']!r}")
    if options.get("compression", "none") not in COMPRESSIONS:
        raise InvalidArgumentError(f"communication['compression'] must be {COMMUNICATION_KEYS['compression']} "
                                   f"(gradients all-reduced in float16), got {options['compression']!r}")
    return options


_SECONDS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60, "minutes": 60,
            "h": 3600, "hour": 3600, "hours": 3600}


def checkpoint_every(value, checkpoint_dir):
    """fit's checkpoint_every: ("steps", n) for a number of steps, ("seconds", s) for a duration such as
    "90s", "10min" or "2h"; None for epoch ends only."""
    if value is None:
        return None
    if checkpoint_dir is None:
        raise InvalidArgumentError(f"checkpoint_every={value!r} needs checkpoint_dir=, the directory to save in")
    if isinstance(value, str):
        import re

        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*", value.lower())
        if match and match.group(2) in _SECONDS and float(match.group(1)) > 0:
            return "seconds", float(match.group(1)) * _SECONDS[match.group(2)]
        raise InvalidArgumentError(f"checkpoint_every must be a number of steps or a duration such as '90s', '10min' "
                                   f"or '2h', got {value!r}")
    try:
        return "steps", positive_int("checkpoint_every", value)
    except InvalidArgumentError:
        raise InvalidArgumentError(f"checkpoint_every must be a number of steps or a duration such as '90s', "
                                   f"'10min' or '2h', got {value!r}") from None


def save_arguments(save_to, save_best, save_mode, validates):
    """(save_to as a directory, save_best, its mode "min"/"max") for fit's saved models."""
    from tfbarrier.ranking import best_mode

    best_mode("", save_mode)  # a bad save_mode is refused even without save_best
    if save_to is None:
        if save_best is not None:
            raise InvalidArgumentError(f"save_best={save_best!r} needs save_to=, the directory to save the models in")
        return None, None, "min"
    save_to = directory("save_to", save_to)
    if save_best is None:
        return save_to, None, "min"
    if not isinstance(save_best, str) or not save_best:
        raise InvalidArgumentError(f"save_best must be the name of a metric such as 'val_loss', got {save_best!r}")
    if save_best.startswith("val_") and not validates:
        raise InvalidArgumentError(f"save_best={save_best!r} is a validation metric: pass validation_data= or "
                                   "validation_split= as well, or monitor a training metric such as 'loss'")
    return save_to, save_best, best_mode(save_best, save_mode)


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
