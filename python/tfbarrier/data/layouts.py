"""Which feature layout (features.py) a DataFrame's columns make: ``layout`` reads fit's, predict's and
the Estimator's ``features=``, ``label=`` and ``sample_weight=`` against the schema, on the driver, and
refuses what no layout takes, naming the column and the fix. A label is a number per row, or an array of
numbers (a sequence label: a causal LM's next tokens, a tagger's classes), whose positions an array of
sample weights may weigh; or none, for a text column whose model's preprocessor makes the labels (a causal LM's)."""

from tfbarrier.data.features import ArrayColumn, ImageColumn, NumericColumns, VectorColumn
from tfbarrier.data.named_inputs import NamedInputs
from tfbarrier.data.text import TextColumn
from tfbarrier.errors import ColumnError, InvalidArgumentError


def _is_numeric(data_type):
    from pyspark.sql.types import BooleanType, NumericType

    return isinstance(data_type, NumericType) and not isinstance(data_type, BooleanType)


def _is_vector(data_type):
    from pyspark.sql.types import UserDefinedType

    return isinstance(data_type, UserDefinedType) and type(data_type).__name__ == "VectorUDT"


def _is_numeric_array(data_type):
    from pyspark.sql.types import ArrayType

    return isinstance(data_type, ArrayType) and _is_numeric(data_type.elementType)


def _check_weight(weight, types, sequences):
    """Refuse a sample_weight column that is not numbers: one per row, or one per position of a sequence label."""
    if _is_numeric(types.get(weight)):
        return
    if weight in types and _is_numeric_array(types[weight]):
        if sequences:
            return
        raise ColumnError(f"sample_weight column {weight!r} holds an array per row, which weighs the positions of a "
                          "sequence label; this fit's label has one value per row: give one weight per row")
    raise ColumnError(f"sample_weight column {weight!r} must be a numeric column of the DataFrame (or, for a sequence "
                      "label, an array of a weight per position)"
                      + ("" if weight not in types else f", not {types[weight].simpleString()}"))


def _names(argument, value, what):
    """{name: column} of a dict ``argument`` (features=, label=), checked."""
    if not value or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidArgumentError(f"{argument} as a dict must map each model {what}'s name to a column name, e.g. "
                                   f"{{\"token_ids\": \"ids\", \"padding_mask\": \"mask\"}}; got {value!r}")
    return value


def layout(schema, features, label=None, scoring=False, weight=None):
    """The layout of the training columns (``scoring``: the feature columns alone; ``weight``: a
    column of sample weights), or a ColumnError naming the column and the fix. ``features`` and
    ``label`` may be dicts: {model input name: column}, {model output name: column}."""
    inputs = outputs = None
    if isinstance(features, dict):
        named = _names("features", features, "input")
        inputs, features = tuple(named), list(named.values())
    if isinstance(features, str):
        features = [features]
    if not features or not isinstance(features, (list, tuple)) or not all(isinstance(f, str) for f in features):
        raise InvalidArgumentError("features must be a column name, a non-empty list of column names, or a dict "
                                   "of model input names to column names")
    if not scoring and isinstance(label, dict):
        named = _names("label", label, "output")
        outputs, label = tuple(named), tuple(named.values())
    elif not scoring and not isinstance(label, str) and not (label is None and _is_text(features, schema)):
        raise InvalidArgumentError(f"label must be a column name, or a dict of model output names to column names, "
                                   f"got {label!r} (only a model whose preprocessor makes the labels from a text "
                                   "column, a causal LM's, trains without one)")
    if weight is not None and not isinstance(weight, str):
        raise InvalidArgumentError(f"sample_weight must be a column name, got {weight!r}")
    types = {field.name: field.dataType for field in schema.fields}
    labels = [] if scoring or label is None else ([label] if isinstance(label, str) else list(label))
    for name in [*features, *labels]:
        if name not in types:
            raise ColumnError(f"column {name!r} is not in the DataFrame; its columns are {sorted(types)}")
    for name in labels:
        if not (_is_numeric(types[name]) or _is_numeric_array(types[name])):
            raise ColumnError(
                f"label column {name!r} has type {types[name].simpleString()}; it must be numeric "
                "(class ids as integers, or a float target), or an array of numbers (a value per position, as a "
                "causal LM's next tokens): cast or index it first"
            )
    sequences = tuple(name for name in labels if _is_numeric_array(types[name]))
    if weight is not None and not scoring and label is None:
        raise ColumnError(f"sample_weight column {weight!r} without a label: a preprocessor that makes the labels from "
                          "the text makes their weights too (a causal LM's padding mask); leave sample_weight out")
    if weight is not None:
        _check_weight(weight, types, sequences)
        sequences += (weight,) if _is_numeric_array(types[weight]) else ()
    common = {"features": tuple(features), "label": None if scoring else label, "weight": weight, "outputs": outputs,
              "sequences": sequences}
    if inputs is not None:
        return NamedInputs(**common, inputs=inputs, **_input_columns(features, types))
    return _kind(features, types)(**common)


def _is_text(features, schema):
    """Whether ``features`` is one string column of ``schema`` (text.TextColumn's)."""
    from pyspark.sql.types import StringType

    names = [features] if isinstance(features, str) else features
    return (isinstance(names, (list, tuple)) and len(names) == 1 and names[0] in schema.names
            and isinstance(schema[names[0]].dataType, StringType))


def _input_columns(features, types):
    """NamedInputs' ``arrays`` and ``vectors`` among ``features``, each checked to be numbers."""
    from pyspark.sql.types import ArrayType

    arrays, vectors = [], []
    for name in features:
        data_type = types[name]
        if _is_vector(data_type):
            vectors.append(name)
        elif isinstance(data_type, ArrayType) and _is_numeric(data_type.elementType):
            pass
        elif not _is_numeric(data_type):
            raise ColumnError(f"feature column {name!r} has type {data_type.simpleString()}; with one column per "
                              "model input each must be numeric, an array of numbers, or a Spark ML vector")
        else:
            continue
        arrays.append(name)
    return {"arrays": tuple(dict.fromkeys(arrays)), "vectors": tuple(dict.fromkeys(vectors))}


def _kind(features, types):
    from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType

    data_type = types[features[0]]
    if len(features) == 1 and isinstance(data_type, StructType) \
            and {"height", "width", "nChannels", "data"} <= set(data_type.names):
        raise ColumnError(
            f"feature column {features[0]!r} is a struct of Spark's image data source, which holds decoded "
            "pixels in BGR order; read the files with spark.read.format(\"binaryFile\").load(path) instead "
            "and pass its \"content\" column (the encoded images, decoded in the training processes)"
        )
    if len(features) == 1 and isinstance(data_type, BinaryType):
        return ImageColumn
    if len(features) == 1 and isinstance(data_type, StringType):
        return TextColumn
    if len(features) == 1 and _is_vector(data_type):
        return VectorColumn
    if len(features) == 1 and isinstance(data_type, ArrayType):
        if not _is_numeric(data_type.elementType):
            raise ColumnError(f"feature column {features[0]!r} is an array of {data_type.elementType.simpleString()}; "
                              "it must hold numbers")
        return ArrayColumn
    for name in features:
        if not _is_numeric(types[name]):
            raise ColumnError(
                f"feature column {name!r} has type {types[name].simpleString()}; features must be numeric "
                "columns, one array column of numbers, one Spark ML vector column, one binary column of "
                "encoded images, or one string column (for a model that carries a preprocessor)"
            )
    return NumericColumns
