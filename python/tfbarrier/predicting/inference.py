"""Distributed inference: score a Spark DataFrame with a Keras model, where the data lives.

The model reaches the executors as scoring_models.py ships it, and each Spark Python worker rebuilds it
once (cached across batches and tasks), then scores each Arrow batch in slices of ``batch_size`` rows.
The scoring function is an iterator Arrow UDF: only the feature columns go to Python and only the
prediction comes back (``mapInArrow`` would ship every input column both ways). TensorFlow is imported on
the executors only inside the scoring function.
"""

from typing import Iterator

import numpy as np
import pyarrow as pa

from tfbarrier import checks
from tfbarrier.data import text
from tfbarrier.data.features import check_width
from tfbarrier.data.layouts import layout as features_layout
from tfbarrier.data.stored_forms import stored_form
from tfbarrier.errors import ColumnError, InvalidArgumentError, ModelError
from tfbarrier.models import native_model
from tfbarrier.models.model_spec import keras_flavor, keras_module
from tfbarrier.models.presets import LoraAdapters
from tfbarrier.predicting import generation
from tfbarrier.predicting.scoring_models import load, scoring_model
from tfbarrier.results import FitResult
from tfbarrier.spark import cluster

OUTPUTS = ("class", "probabilities", "raw", "features", "text")


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
    model : Keras model (Keras 3 or tf_keras), FitResult, or a preset fit's LoraAdapters (loaded here)
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
    if isinstance(model, LoraAdapters):  # a preset's fit: its task with the trained adapters, loaded here
        model = model.load()
    if output not in OUTPUTS:
        raise InvalidArgumentError(f"output must be one of {OUTPUTS}, got {output!r}")
    if output == "text":
        raise InvalidArgumentError("output='text' generates on the executors, with predict(); on this machine, "
                                   "call the model's own generate()")
    batch_size = checks.positive_int("batch_size", batch_size)
    if keras_flavor(model) is None:
        raise ModelError(f"model must be a Keras model or a FitResult, got {type(model).__name__}")
    if output == "features":
        model = feature_extractor(model, layer)
    input_shape = _input_shape(model)
    names = output_names(model)
    heads = [(i, _output_transform(head_model(model, i), output)) for i in range(len(names or [None]))]
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
    scored = [_outputs(raw[i], output, transform) for i, transform in heads]
    return scored[0] if names is None else dict(zip(names, scored))


def output_names(model):
    """The names of the model's outputs (its output layers'), when it has several; else None."""
    outputs = getattr(model, "outputs", None) or []
    if len(outputs) < 2:
        return None
    return list(getattr(model, "output_names", None) or [f"output_{i}" for i in range(len(outputs))])


def head_model(model, index):
    """The model of its output ``index`` alone (for its last activation); the model itself when it has one."""
    if output_names(model) is None:
        return model
    return keras_module(keras_flavor(model)).Model(model.inputs, model.outputs[index])


def _input_shape(model):
    """The model's per-sample input shape ({input name: shape} for a Keras 3 model of several)."""
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


def _raw_outputs(model, x, batch_size):
    """The model's raw outputs for the rows of ``x`` (an array, or a tf.data pipeline of batches): a
    (rows, units) float32 array per model output, in the order of its outputs."""
    slices = (x[i:i + batch_size] for i in range(0, len(x), batch_size)) if isinstance(x, np.ndarray) else x
    names = output_names(model)
    chunks = []
    for chunk in slices:
        predicted = model.predict_on_batch(chunk)
        if isinstance(predicted, dict):
            predicted = [predicted[name] for name in names]
        chunks.append([np.asarray(each) for each in (predicted if names else [predicted])])
    if not chunks:
        return [np.zeros((0, 1), np.float32)] * len(names or [None])
    return [np.concatenate(parts).reshape(sum(len(p) for p in parts), -1).astype(np.float32) for parts in zip(*chunks)]


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


def output_column(values, output):
    """Scores as an Arrow array: class ids (int64), else a list of float32 per row."""
    if output == "class":
        return pa.array(values.astype(np.int64))
    flat = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1).astype(np.float32)), values.shape[1])
    return flat.cast(pa.list_(pa.float32()))


def _scorer(scoring, layout, input_shape, output, heads, batch_size):
    """A function of one partition's Arrow record batches of the feature columns to its predictions, one
    Arrow array per batch. ``heads``: {column: (the model output's index, its transform)}; with several, a
    struct array of one field per column."""

    def score(batches):
        model = None
        offset = 0  # rows of this partition scored so far
        for batch in batches:
            if model is None:
                model = load(scoring)
            raw = _batch_outputs(model, layout, batch, input_shape, batch_size, offset)
            offset += len(batch)
            columns = [output_column(_outputs(raw[i], output, transform), output) for i, transform in heads.values()]
            yield columns[0] if len(heads) == 1 else pa.StructArray.from_arrays(columns, list(heads))

    return score


def _heads(model, output_col, output, taken):
    """{new column: (the model output's index, its transform)}: ``output_col`` for a model of one output; for
    a model of several, ``output_col``'s dict {output name: column}, or a column "<output_col>_<name>" each."""
    names = output_names(model)
    if names is None or isinstance(output_col, str):
        columns = {output_col: 0} if names is None else {f"{output_col}_{name}": i for i, name in enumerate(names)}
    elif isinstance(output_col, dict) and output_col and set(output_col) <= set(names):
        columns = {column: names.index(name) for name, column in output_col.items()}
    else:
        raise InvalidArgumentError(f"output_col must be a column name, or a dict of the model's outputs {names} to "
                                   f"new column names; got {output_col!r}")
    for column in columns:
        _check_new_column(column, taken)
    return {column: (i, _output_transform(head_model(model, i), output)) for column, i in columns.items()}


def _check_new_column(column, taken):
    if not isinstance(column, str) or column in taken:
        raise ColumnError(f"output_col {column!r} must be a new column name; the DataFrame has {taken}")


def scoring_udf(score, return_type):
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
            if pa.types.is_struct(scores.type):  # a struct's pandas form is a DataFrame of its fields
                yield pa.RecordBatch.from_struct_array(scores).to_pandas()
            else:
                yield scores.to_pandas()

    return pandas_udf(pandas_scores, return_type)


def predict(data, model, *, features, output_col="prediction", batch_size=1024, output="class", layer=-2,
            max_length=None, sampler="greedy", strip_prompt=False):
    """Score ``data`` with ``model`` on the executors; a Spark DataFrame (lazy, like any transformation)
    with every input column plus ``output_col``.

    Parameters
    ----------
    data : pyspark.sql.DataFrame
    model : Keras model (Keras 3 or tf_keras), FitResult, or a preset fit's LoraAdapters
        A preset's adapters travel alone: each executor loads the preset from its path and the adapters on it.
    features : str, list of str or dict
        As in ``fit``: one array column, numeric columns, one binary column of encoded images, or
        {input name: column} for a Keras 3 model of several inputs.
    output_col : str or dict
        Name of the new column. For a model of several outputs, a column per output, named
        "<output_col>_<output name>"; or {output name: column} for the outputs named, in those columns.
    batch_size : int
        Rows per forward pass (prompts per ``generate`` call with ``output="text"``).
    output : "class", "probabilities", "raw", "features" or "text"
        Class id (long; argmax, or probability > 0.5 for one output unit), probabilities (array<float>;
        softmax/sigmoid applied when the last layer outputs logits), the raw outputs (array<float>),
        ``layer``'s output, flattened (array<float>): the model as a feature extractor, for
        transfer learning; or, for a KerasHub causal LM with its preprocessor, the text it generates
        from the prompt column (string; generation.py).
    layer : str or int
        With ``output="features"``: the layer's name, or its index in ``model.layers`` (default -2,
        the one before the last).
    max_length, sampler, strip_prompt
        With ``output="text"``: tokens a row at most, prompt included (default the preprocessor's
        ``sequence_length``); a KerasHub sampler or its name ("greedy", the default; seed a sampling one,
        e.g. ``keras_hub.samplers.TopKSampler(k=5, seed=1)``, to repeat it); whether the column holds the
        continuation alone.
    """
    data = checks.spark_dataframe(data)
    batch_size = checks.positive_int("batch_size", batch_size)
    if output not in OUTPUTS:
        raise InvalidArgumentError(f"output must be one of {OUTPUTS}, got {output!r}")
    model, adapters = _driver_model(model, output)
    flavor = keras_flavor(model)
    if flavor is None:
        raise ModelError(f"model must be a Keras model or a FitResult, got {type(model).__name__}")
    if output == "features":
        model = feature_extractor(model, layer)
    layout = features_layout(data.schema, features, scoring=True)
    if output == "text":
        return _generated(data, (model, adapters), layout, output_col, batch_size,
                          generation.settings(model, layout, max_length, sampler, strip_prompt))
    if layout.takes_text:
        text.check_model(model, layout.features[0], flavor == "keras3")
    input_shape = _input_shape(model)
    layout.check_input(input_shape)  # predict stays lazy: array lengths are checked batch by batch in the tasks
    heads = _heads(model, output_col, output, data.columns)
    cluster.check_executor_python(data.sparkSession)
    from pyspark.sql import functions as F

    score = _scorer(scoring_model(data.sparkSession, model, adapters), layout, input_shape, output, heads, batch_size)
    kind = "long" if output == "class" else "array<float>"
    udf = scoring_udf(score, kind if len(heads) == 1 else ", ".join(f"`{c}`: {kind}" for c in heads).join(("struct<", ">")))
    features_struct = F.struct(*layout.feature_projection(data.sparkSession))
    if len(heads) == 1:
        return data.withColumn(next(iter(heads)), udf(features_struct))
    # nondeterministic: Spark then computes the struct once, not once per column taken from it
    struct = "__tfbarrier_scores"
    scored = data.withColumn(struct, udf.asNondeterministic()(features_struct))
    return scored.withColumns({column: F.col(struct)[column] for column in heads}).drop(struct)


def _driver_model(model, output):
    """(the Keras model predict checks on the driver, the LoraAdapters the executors load with their preset, or
    None) for predict's ``model``: a FitResult's model; a preset's adapters on their task's structure, the
    preset's weights left unread here (but read for ``output="features"``, whose model is cut from it here)."""
    if isinstance(model, FitResult):
        model = model.model
    if not isinstance(model, LoraAdapters):
        return model, None
    if output == "features":
        return model.load(), None
    return model.load(weights=False), model


def _generated(data, models, layout, output_col, batch_size, settings):
    """``data`` with ``output_col``, the text the model generates from the prompt column (generation.py);
    ``models``: (the model, its LoraAdapters or None), as scoring_model takes them."""
    _check_new_column(output_col, data.columns)
    cluster.check_executor_python(data.sparkSession)
    from pyspark.sql import functions as F

    score = generation.generator(scoring_model(data.sparkSession, *models), layout, settings, batch_size)
    return data.withColumn(output_col, scoring_udf(score, "string")(F.struct(*layout.feature_projection(data.sparkSession))))
