"""Distributed inference: score a Spark DataFrame with a Keras model, where the data lives.

The model travels as its config and a weights file (model_spec.py) that the driver serves for as
long as it runs (transfer.session_server): each executor host fetches the file once into its
temporary directory (the last MODELS_KEPT of them are kept), outside Spark's JVM, and each Spark Python
worker rebuilds the model once (cached across batches and tasks), then scores each Arrow batch in
slices of ``batch_size`` rows. Where the driver cannot serve files (``spark.tfbarrier.driverLink=false``,
or it cannot listen on its address), Spark encrypts its traffic (the link does not), or the session is
attached to another program's JVM (attach.py: that program computes the predictions, maybe while this
process runs no Python, or after it is gone), the weights go in a Spark broadcast. The scoring function is an iterator Arrow UDF: only the feature columns go to
Python and only the prediction comes back (``mapInArrow`` would ship every input column both ways).
TensorFlow is imported on the executors only inside the scoring function.

Test hook: when ``TFBARRIER_MODEL_LOAD_LOG`` (settings.MODEL_LOAD_LOG_ENV) names a file in an
executor's environment, every model load appends a line ``<pid> <model id>`` to it.
"""

import collections
import contextlib
import hashlib
import os
import tempfile
from typing import Iterator

import cloudpickle
import numpy as np
import pyarrow as pa

from . import atomic, checks, cluster, driver_link, native_model, transfer
from .attach import is_attached
from .errors import ClusterError, ColumnError, InvalidArgumentError, ModelError
from .features import check_width
from .stored_forms import stored_form
from .layouts import layout as features_layout
from .model_spec import keras_flavor, keras_module, read_weights, tf_variable, write_weights
from .results import FitResult
from .settings import MODEL_LOAD_LOG_ENV

OUTPUTS = ("class", "probabilities", "raw", "features")
_CACHE_SIZE = 2  # models kept per Python worker
MODELS_KEPT = 4  # weights files kept per executor host
_models = collections.OrderedDict()  # model id -> loaded model, in this Python worker


def _last_activation(model):
    try:
        return model.layers[-1].get_config().get("activation")
    except (AttributeError, IndexError, NotImplementedError):
        return None


def _output_transform(model, output):
    """How raw outputs become probabilities: "none" (already probabilities), "softmax" or "sigmoid"
    (the model outputs logits), decided on the driver from the last layer's activation."""
    if output in ("raw", "features"):
        return "none"
    activation = _last_activation(model)
    if activation in ("softmax", "sigmoid"):
        return "none"
    if activation == "linear":
        return "sigmoid" if model.output_shape[-1] == 1 else "softmax"
    raise ModelError(
        f"cannot tell probabilities from the model's last activation ({activation!r}): "
        "use output='raw' and transform the outputs yourself"
    )


def _probabilities(raw, transform):
    if transform == "softmax":
        shifted = np.exp(raw - raw.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)
    if transform == "sigmoid":
        return 1.0 / (1.0 + np.exp(-raw))
    return raw


def _outputs(raw, output, transform):
    """Class ids, probabilities or raw outputs from a (rows, units) array of raw model outputs."""
    if output in ("raw", "features"):
        return raw
    probabilities = _probabilities(raw, transform)
    if output == "probabilities":
        return probabilities
    return np.argmax(probabilities, axis=1) if raw.shape[1] > 1 else (probabilities[:, 0] > 0.5).astype(np.int64)


def predict_local(model, data, features=None, output="class", batch_size=1024, layer=-2):
    """Predictions of ``model`` for the rows of ``data`` on this machine, as ``predict`` makes them on the
    executors (the same feature layouts, forward passes and outputs); what R's ``predict()`` on a fit calls.

    Parameters
    ----------
    model : Keras model (Keras 3 or tf_keras) or FitResult
    data : numpy.ndarray, pandas.DataFrame or dict
        An array of one row per example (flat features, or the model's input shape), or a DataFrame whose
        ``features`` columns are read as ``predict``'s tasks read a Spark DataFrame's (features.py): numeric
        columns, one column of arrays (e.g. a flat image, or a Spark ML vector collected as an array), or one
        column of encoded images (bytes). A dict of columns, ``{name: values}``, is such a DataFrame, a 2-D
        array in it a column of arrays (one row per example), as R hands columns over (frames.py).
    features : str or list of str
        As in ``predict``; by default every column of ``data``. Unused for an array.
    output, batch_size, layer
        As in ``predict``.
    """
    if isinstance(model, FitResult):
        model = model.model
    if output not in OUTPUTS:
        raise InvalidArgumentError(f"output must be one of {OUTPUTS}, got {output!r}")
    batch_size = checks.positive_int("batch_size", batch_size)
    if keras_flavor(model) is None:
        raise ModelError(f"model must be a Keras model or a FitResult, got {type(model).__name__}")
    if output == "features":
        model = feature_extractor(model, layer)
    input_shape = _input_shape(model)
    transform = _output_transform(model, output)
    batch = _local_batch(data)
    if batch is None:
        if isinstance(input_shape, dict):
            raise InvalidArgumentError("a model of several inputs scores a DataFrame (or a dict of columns) with "
                                       "features={input name: column}, not an array")
        x = np.asarray(data, dtype=np.float32)
        x = x.reshape(len(x), -1)
        check_width(x.shape[1], input_shape)
        raw = _raw_outputs(model, x if input_shape is None else x.reshape((-1, *input_shape)), batch_size)
    else:
        from pyspark.sql.pandas.types import from_arrow_schema

        layout = features_layout(from_arrow_schema(batch.schema), batch.schema.names if features is None else features,
                                 scoring=True)
        raw = _batch_outputs(model, layout, batch, input_shape, batch_size, 0)
    return _outputs(raw, output, transform)


def _input_shape(model):
    """The model's per-sample input shape ({input name: shape} for a Keras 3 model of several); a model
    of several outputs is refused."""
    outputs = getattr(model, "outputs", None) or []
    if len(outputs) > 1:
        names = ", ".join(repr(getattr(getattr(t, "_keras_history", None), "operation", t).name) for t in outputs)
        raise ModelError(f"the model has several outputs ({names}), and predict scores one: pass the model of the "
                         "output you want, e.g. keras.Model(model.inputs, model.get_layer(\"<output>\").output)")
    if keras_flavor(model) == "keras3":
        return native_model.input_shape_of(model)
    return tuple(model.input_shape[1:])


def _local_batch(data):
    """``predict_local``'s DataFrame (or dict of columns) as one Arrow record batch, as a pandas UDF's frame
    becomes one on the executors; None for anything else (an array)."""
    import pandas as pd

    if not isinstance(data, (dict, pd.DataFrame)):
        return None
    if isinstance(data, dict) and not data:
        raise InvalidArgumentError("data must have at least one column")
    try:
        if isinstance(data, dict):
            data = pd.DataFrame({name: list(values) if getattr(values, "ndim", 1) == 2 else values
                                 for name, values in data.items()})
        return pa.RecordBatch.from_pandas(data, preserve_index=False)
    except (ValueError, TypeError) as exc:  # pyarrow's ArrowInvalid and ArrowTypeError among them
        raise ColumnError(f"the DataFrame's columns do not convert to Arrow ({exc}): give numbers, arrays of "
                          "numbers, or encoded images (bytes)") from None


def feature_extractor(model, layer):
    """The model truncated at ``layer`` (a name, or an index into ``model.layers``, negative from the
    end): its inputs to that layer's output, with the model's own weights, in the model's Keras. Made
    on the driver; what ``predict(output="features")`` scores with."""
    if isinstance(layer, bool) or not isinstance(layer, (str, int)):
        raise InvalidArgumentError(f"layer must be a layer's name or index, got {layer!r}")
    try:
        chosen = model.get_layer(name=layer) if isinstance(layer, str) else model.layers[layer]
    except (ValueError, IndexError):
        names = ", ".join(repr(each.name) for each in model.layers)
        raise InvalidArgumentError(f"the model has no layer {layer!r}: its layers are {names} "
                                   "(or an index into them, e.g. -2 for the one before the last)") from None
    if isinstance(chosen.output, (list, tuple, dict)):
        raise ModelError(f"layer {chosen.name!r} has several outputs: pick a layer with one")
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs  # a list would want a list of arrays
    return keras_module(keras_flavor(model)).Model(inputs, chosen.output, name=f"{model.name}_{chosen.name}")


def _scoring_model(spark, model):
    """What executors rebuild ``model`` from: its flavor, JSON config and weights, the weights served by
    the driver (a transfer.Payload and the server's endpoint) or, where it cannot serve them, in a
    broadcast; and an id naming that model."""
    flavor, config = keras_flavor(model), model.to_json()
    # The weights' digest names their file: the session's server writes a content it serves already only once.
    name = f"{write_weights(model.weights)[:32]}-scoring.safetensors"

    def write(path):
        write_weights(model.weights, path)

    source = None
    if cluster.driver_link_enabled(spark) and not cluster.encryption_enabled(spark) and not is_attached(spark):
        try:
            files, server = transfer.session_server(cluster.driver_host(spark))
            source = {"endpoint": server.endpoint, "payload": files.add_file(name, write)}
        except OSError:
            source = None
    if source is None:
        with transfer.JobFiles() as scratch:
            payload = scratch.inline(scratch.add(name, write))
        source = {"broadcast": cluster.broadcast(spark, payload.data), "payload": transfer.Payload(name, payload.size)}
    model_id = hashlib.sha256((config + source["payload"].name).encode()).hexdigest()[:32]
    # Keras 3's own classes and functions the config names (custom layers, a subclassed model's class)
    objects = native_model.pickled_custom_objects(model) if flavor == "keras3" else None
    return {"flavor": flavor, "config": config, "id": model_id, "objects": objects, **source}


def _weights_file(scoring):
    """This host's copy of the scoring model's weights, fetched from the driver the first time."""
    directory = os.path.join(tempfile.gettempdir(), f"tfbarrier-models-{os.getuid()}")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, scoring["payload"].name)
    if os.path.exists(path):
        os.utime(path)
        return path
    if "broadcast" in scoring:
        with atomic.written_aside(path) as f:
            f.write(scoring["broadcast"].value)
    else:
        endpoint = scoring["endpoint"]
        try:
            driver_link.fetch(endpoint, scoring["payload"].name, path)
        except OSError as exc:
            raise ClusterError(
                f"this executor could not fetch the model from the driver at {endpoint['host']}:{endpoint['port']} "
                f"({type(exc).__name__}: {exc}): executors must reach the driver on that port, or set "
                "spark.tfbarrier.driverLink=false to send models through Spark") from None
    prune_models(directory, MODELS_KEPT)
    return path


def prune_models(directory, kept):
    """Delete all but the ``kept`` most recently used weights files in ``directory``. The host's other
    Python workers may prune at the same moment: a file they deleted first is not an error."""
    used = {}
    for entry in os.scandir(directory):
        if ".part-" not in entry.name:
            with contextlib.suppress(FileNotFoundError):
                used[entry.path] = entry.stat().st_mtime
    for old in sorted(used, key=used.get, reverse=True)[kept:]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(old)


def _load(scoring):
    model_id = scoring["id"]
    if model_id not in _models:
        import tensorflow as tf
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and not _models:  # first TensorFlow use in this Python worker
            try:
                tf.config.threading.set_intra_op_parallelism_threads(context.cpus())
            except RuntimeError:
                pass  # TensorFlow already initialised by earlier code in this worker
        keras = keras_module(scoring["flavor"])
        objects = cloudpickle.loads(scoring["objects"]) if scoring.get("objects") else {}
        with keras.saving.custom_object_scope(objects) if objects else contextlib.nullcontext():
            model = keras.models.model_from_json(scoring["config"])
        read_weights(_weights_file(scoring), model.weights, lambda variable: [tf_variable(variable)])
        _models[model_id] = model
        while len(_models) > _CACHE_SIZE:
            _models.popitem(last=False)
        log = os.environ.get(MODEL_LOAD_LOG_ENV)
        if log:
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {model_id}\n")
    _models.move_to_end(model_id)
    return _models[model_id]


def _raw_outputs(model, x, batch_size):
    """The model's raw outputs for the rows of ``x`` (an array, or a tf.data pipeline of batches) as
    a (rows, units) float32 array."""
    slices = (x[i:i + batch_size] for i in range(0, len(x), batch_size)) if isinstance(x, np.ndarray) else x
    chunks = [np.asarray(model.predict_on_batch(chunk)) for chunk in slices]
    if not chunks:
        return np.zeros((0, 1), np.float32)
    raw = np.concatenate(chunks)
    return raw.reshape(len(raw), -1).astype(np.float32)


def _batch_outputs(model, layout, batch, input_shape, batch_size, offset):
    """Raw outputs for one Arrow record batch of the feature columns, read by ``layout`` as a training
    process reads its shard (stored_forms.py). A row the model cannot take (an image that does not
    decode) fails the Spark task with a ColumnError naming its row in the partition (``offset``: rows
    before this batch); the driver sees it in the failed job's Python traceback."""
    import tensorflow as tf

    x = layout.x(batch)
    stored = stored_form(x.type)
    layout.check_input(input_shape, stored.width(x.type) if len(x) else None)
    rows = stored.to_numpy(x)
    try:
        return _raw_outputs(model, stored.scoring_input(tf, rows, input_shape, batch_size), batch_size)
    except tf.errors.OpError:
        bad = stored.first_unreadable(rows, input_shape)
        if bad is None:
            raise
        raise ColumnError(f"row {offset + bad[0]} of the partition does not decode as an image ({bad[1]}): "
                          "filter out the broken images first") from None


def _scorer(scoring, layout, input_shape, output, transform, batch_size):
    """A function of one partition's Arrow record batches of the feature columns to its predictions, one
    Arrow array per batch."""

    def score(batches):
        model = None
        offset = 0  # rows of this partition scored so far
        for batch in batches:
            if model is None:
                model = _load(scoring)
            raw = _batch_outputs(model, layout, batch, input_shape, batch_size, offset)
            offset += len(batch)
            values = _outputs(raw, output, transform)
            if output == "class":
                yield pa.array(values.astype(np.int64))
            else:
                flat = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), raw.shape[1])
                yield flat.cast(pa.list_(pa.float32()))

    return score


def _scoring_udf(score, return_type):
    """``score`` as a Spark UDF of the features' struct column: an iterator Arrow UDF (pyspark 4.1 and
    later), else an iterator pandas UDF whose frames become Arrow record batches (pyspark 3.5 and 4.0)."""
    try:
        from pyspark.sql.pandas.functions import arrow_udf
    except ImportError:
        arrow_udf = None
    if arrow_udf is not None:
        def arrow_scores(structs: Iterator[pa.Array]) -> Iterator[pa.Array]:  # pyspark reads the kind from hints
            return score(pa.RecordBatch.from_struct_array(struct) for struct in structs)

        return arrow_udf(arrow_scores, return_type)
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    def pandas_scores(frames: Iterator[pd.DataFrame]) -> Iterator[pd.Series]:
        for scores in score(pa.RecordBatch.from_pandas(frame, preserve_index=False) for frame in frames):
            yield scores.to_pandas()

    return pandas_udf(pandas_scores, return_type)


def predict(data, model, *, features, output_col="prediction", batch_size=1024, output="class", layer=-2):
    """Score ``data`` with ``model`` on the executors; a Spark DataFrame (lazy, like any transformation)
    with every input column plus ``output_col``.

    Parameters
    ----------
    data : pyspark.sql.DataFrame
    model : Keras model (Keras 3 or tf_keras) or FitResult
    features : str or list of str
        As in ``fit``: one array column, numeric columns, or one binary column of encoded images.
    output_col : str
        Name of the new column.
    batch_size : int
        Rows per forward pass.
    output : "class", "probabilities", "raw" or "features"
        Class id (long; argmax, or probability > 0.5 for one output unit), probabilities (array<float>;
        softmax/sigmoid applied when the last layer outputs logits), the raw outputs (array<float>),
        or ``layer``'s output, flattened (array<float>): the model as a feature extractor, for
        transfer learning.
    layer : str or int
        With ``output="features"``: the layer's name, or its index in ``model.layers`` (default -2,
        the one before the last).
    """
    if isinstance(model, FitResult):
        model = model.model
    data = checks.spark_dataframe(data)
    batch_size = checks.positive_int("batch_size", batch_size)
    if output not in OUTPUTS:
        raise InvalidArgumentError(f"output must be one of {OUTPUTS}, got {output!r}")
    if not isinstance(output_col, str) or output_col in data.columns:
        raise ColumnError(f"output_col {output_col!r} must be a new column name; the DataFrame has {data.columns}")
    flavor = keras_flavor(model)
    if flavor is None:
        raise ModelError(f"model must be a Keras model or a FitResult, got {type(model).__name__}")
    if output == "features":
        model = feature_extractor(model, layer)
    layout = features_layout(data.schema, features, scoring=True)
    input_shape = _input_shape(model)
    layout.check_input(input_shape)  # predict stays lazy: array lengths are checked batch by batch in the tasks
    transform = _output_transform(model, output)
    cluster.check_executor_python(data.sparkSession)
    from pyspark.sql import functions as F

    score = _scorer(_scoring_model(data.sparkSession, model), layout, input_shape, output, transform, batch_size)
    udf = _scoring_udf(score, "long" if output == "class" else "array<float>")
    return data.withColumn(output_col, udf(F.struct(*layout.feature_projection(data.sparkSession))))
