"""tfbarrier: train TensorFlow/Keras models across a Spark cluster with one call.

    result = tfbarrier.fit(df, model, features="pixels", label="digit", epochs=3, batch_size=64, num_workers=2)

Importing tfbarrier does not import TensorFlow: executors and R sessions pay for it only in the
training processes. Nor does it import the calls' modules (and with them numpy and pyarrow)
until one is used: a training process, and a spare's keeper, start on the light modules they need
(0.23 s of a training process's start before TensorFlow's import, when this file imported them all).
"""

import importlib

from tfbarrier import errors, tf_banners

# What ``tfbarrier.<name>`` is, and the module it comes from.
# A call is never named as a module: importing a submodule sets the package's attribute of its name, over
# the call (``tfbarrier.attach`` was both, and became the module once ``attached_session`` was used).
_CALLS = {"FitResult": "api", "apply": "functions.calls", "fit": "api", "run": "functions.calls",
          "attach": "spark.attachment", "attached_session": "spark.attachment", "detach": "spark.attachment",
          "PythonEnv": "spark.environment", "preset": "models.presets", "spark_frame": "frames", "predict": "predicting.inference", "predict_local": "predicting.inference",
          "TuneResult": "tuning", "tune": "tuning"}


def __getattr__(name):
    """A call or class of ``_CALLS``, or a submodule (R's ``core$r_closure``), imported on first use."""
    module = _CALLS.get(name, name)
    try:
        imported = importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{module}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(imported, name) if name in _CALLS else imported
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_CALLS))


tf_banners.install()

__version__ = "0.2.0"
__all__ = ["FitResult", "PythonEnv", "TuneResult", "apply", "attach", "attached_session", "detach", "errors", "fit",
           "predict", "predict_local", "preset", "run", "spark_frame", "tune", "__version__"]
