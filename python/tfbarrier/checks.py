"""The driver's checks of the calls' arguments, each raising an error that names the problem and the fix,
before any cluster work. The data's are data/profiles.py's; an exchange's options, tfbarrier.exchange's."""

import difflib
import inspect
import numbers
import os

from tfbarrier.errors import InvalidArgumentError
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


def optional_positive_int(name, value):
    return positive_int(name, value, allow_none=True)


def optional_int(name, value):
    """An integer (a whole float, as R's numbers come, too) or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or int(value) != value:
        raise InvalidArgumentError(f"{name} must be an integer or None, got {value!r}")
    return int(value)


def flag(name, value):
    """A switch: True or False (R's logical arrives as a bool, 0/1 as numbers)."""
    return bool(value)


def steps_per_execution(name, value):
    """fit's steps_per_execution: "auto", None (as the model was compiled) or a positive integer."""
    if value is None or value == "auto":
        return value
    if isinstance(value, str):
        raise InvalidArgumentError(f'{name} must be "auto", None or a positive integer, got {value!r}')
    return positive_int(name, value)


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


def class_weights(name, class_weight):
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
        raise InvalidArgumentError(f"{name} must map class ids (integers >= 0) to weights >= 0, e.g. "
                                   f"{{0: 1.0, 1: 5.0}}; got {class_weight!r}")
    return weights


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
