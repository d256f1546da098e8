"""Feature layouts: which columns of a DataFrame hold a row's features, and how they become the model's input.

``layout`` chooses one from the DataFrame's schema on the driver, and the job carries it to the tasks.
Each kind owns its whole path, so a new kind of feature column is one class here:

- ``projection``: the Spark columns a stage selects (a vector column is turned into an array there);
- ``aggregates`` and ``check_profile``: what the driver's one aggregate pass measures, and refuses;
- ``x``: how a Spark Arrow batch becomes the shard's ``x`` (in the task) or the scored rows;
- ``check_input``: whether rows fill the model's input, wherever the model's input shape is known;
- ``stored``: how the shard holds ``x`` and how a training process (or predict's task) reads it back
  (``FloatRows``, ``EncodedImages``: the process-side half of a layout, TensorFlow passed in).

The kinds: numeric columns (``NumericColumns``), one array column of numbers (``ArrayColumn``), one
Spark ML vector column, dense or sparse (``VectorColumn``), one binary column of encoded images
(``ImageColumn``).
"""

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import cluster
from .errors import ColumnError, InvalidArgumentError, ModelError

IMAGE_CHANNELS = (1, 3, 4)


# ---- how a shard holds x, and how a training process reads it back --------------------------------------

class FloatRows:
    """x as a fixed-size list of float32 per row: one flat feature vector, reshaped to the model's input."""

    decoded = False  # rows reach the model as they are: none can fail to be read

    @staticmethod
    def matches(x_type):
        return pa.types.is_fixed_size_list(x_type)

    @staticmethod
    def width(x_type):
        """Feature values per row (checked as rows are written), or None when rows have no width."""
        return x_type.list_size

    @staticmethod
    def to_numpy(column):
        """A FixedSizeListArray of float32 as a (rows, width) NumPy array (no copy when possible)."""
        return column.values.to_numpy(zero_copy_only=False).reshape(-1, column.type.list_size)

    @staticmethod
    def bytes_of(column):
        """The column's values as bytes, in order (for a shard's digest)."""
        return [FloatRows.to_numpy(column).tobytes()]

    @staticmethod
    def model_x(x, input_shape):
        return x.reshape((-1, *input_shape))

    @staticmethod
    def spec(tf, input_shape):
        """The tf.data element spec of a batch of x, as ``model_x`` makes it."""
        return tf.TensorSpec((None, *input_shape), tf.float32)

    @staticmethod
    def prepared(tf, ds, input_shape):
        """A tf.data pipeline of (x, ...) rows, made ready for the model (nothing to do)."""
        return ds

    @staticmethod
    def scoring_input(tf, rows, input_shape, batch_size):
        """What predict's task hands the model for ``rows`` (``to_numpy``'s): the array, sliced later."""
        return FloatRows.model_x(rows, input_shape)

    @staticmethod
    def padding(tf, count, input_shape):
        """``count`` rows of x that pad a validation shard."""
        return np.zeros((count, *input_shape), np.float32)

    @staticmethod
    def first_unreadable(rows, input_shape):
        """(position, reason) of the first of ``rows`` the model cannot take, else None: every row of
        numbers can be taken."""
        return None


class EncodedImages:
    """x as one encoded image file per row, decoded (images.py) after the shuffle, in parallel."""

    decoded = True  # a row that does not decode fails the pipeline: first_unreadable finds it

    @staticmethod
    def matches(x_type):
        return pa.types.is_binary(x_type)

    @staticmethod
    def width(x_type):
        return None

    @staticmethod
    def to_numpy(column):
        return column.to_numpy(zero_copy_only=False)

    @staticmethod
    def bytes_of(column):
        return column.to_pylist()

    @staticmethod
    def model_x(x, input_shape):
        return x

    @staticmethod
    def spec(tf, input_shape):
        return tf.TensorSpec((None,), tf.string)

    @staticmethod
    def prepared(tf, ds, input_shape):
        from .images import decode_image

        return ds.map(lambda x, *rest: (decode_image(x, input_shape), *rest), num_parallel_calls=tf.data.AUTOTUNE)

    @staticmethod
    def scoring_input(tf, rows, input_shape, batch_size):
        """Batches of the images decoded in a parallel tf.data map."""
        from .images import decode_image

        return (tf.data.Dataset.from_tensor_slices(rows)
                .map(lambda data: decode_image(data, input_shape), num_parallel_calls=tf.data.AUTOTUNE)
                .batch(batch_size))

    @staticmethod
    def padding(tf, count, input_shape):
        blank = tf.io.encode_png(tf.zeros((1, 1, input_shape[-1]), tf.uint8)).numpy()  # any image that decodes
        return np.array([blank] * count, dtype=object)

    @staticmethod
    def first_unreadable(rows, input_shape):
        from .images import undecodable_row

        return undecodable_row(rows, input_shape)


STORED_FORMS = (FloatRows, EncodedImages)


def stored_form(x_type):
    """How a shard whose x column has ``x_type`` holds its rows (one of STORED_FORMS)."""
    return next(form for form in STORED_FORMS if form.matches(x_type))


def check_width(width, input_shape):
    """Refuse rows of ``width`` values that do not fill the model's per-sample ``input_shape``."""
    if width is None or input_shape is None or None in input_shape:
        return
    needed = math.prod(input_shape)
    if width != needed:
        raise ModelError(
            f"each row has {width} feature values but the model's input shape {tuple(input_shape)} needs "
            f"{needed}: choose the matching feature columns or change the model's input"
        )


def check_image_input(input_shape):
    """Refuse a model that cannot take decoded images: its input must be (height, width, channels)."""
    if input_shape is None:
        return
    shape = tuple(input_shape)
    if len(shape) != 3 or None in shape or shape[2] not in IMAGE_CHANNELS:
        raise ModelError(
            f"the features are encoded images, so the model's input shape must be (height, width, channels) "
            f"with 1, 3 or 4 channels (images are resized to it), got {shape}; e.g. keras.Input((224, 224, 3))"
        )


@dataclasses.dataclass(frozen=True)
class Features:
    """The feature columns, the label (None when scoring) and the sample weights' column (or None)."""

    features: tuple
    label: str = None
    weight: str = None
    noun = "feature column", "arrays", "length"  # how messages name the column, its rows, their width
    stored = FloatRows  # how the shard holds x

    @property
    def columns(self):
        """The training columns' names, as the projection names them."""
        return [*self.features, *(name for name in (self.label, self.weight) if name is not None)]

    def feature_projection(self, spark):
        """The Spark columns that carry the features to Python (in ``spark``'s session)."""
        from pyspark.sql import functions as F

        return [F.col(name) for name in self.features]

    def projection(self, spark):
        """The Spark columns of a stage's frame: the features as ``feature_projection``, then the label
        and the weights."""
        from pyspark.sql import functions as F

        return [*self.feature_projection(spark), *(F.col(name) for name in self.columns[len(self.features):])]

    def aggregates(self):
        """Spark aggregates the driver's profile of the data adds for this kind."""
        return []

    def check_profile(self, profile, input_shape):
        """Refuse what the profile shows the model could not take."""
        self.check_input(input_shape)

    def check_input(self, input_shape, width=None):
        """Refuse a model whose input rows of ``width`` values (None: not known yet) cannot fill."""
        check_width(width, input_shape)

    def check_widths(self, shortest, longest):
        """Refuse rows of different widths (feature values per row)."""
        column, rows, length = self.noun
        if shortest != longest:
            raise ColumnError(f"{column} {self.features[0]!r} holds {rows} of different {length}s ({shortest} to "
                              f"{longest}); every row must have the same {length} (filter or pad first)")

    def empty_x_type(self):
        """The type of ``x`` in a shard without rows."""
        return pa.list_(pa.float32(), 1)

    def x(self, batch):
        """The batch's features as a FixedSizeListArray of float32 (one row per example)."""
        raise NotImplementedError


class NumericColumns(Features):
    """Numeric columns, one value each."""

    def check_input(self, input_shape, width=None):
        check_width(len(self.features), input_shape)

    def x(self, batch):
        arrays = [batch.column(name) for name in self.features]
        for name, array in zip(self.features, arrays):
            if array.null_count:
                raise ColumnError(f"feature column {name!r} has null values: drop or impute them first")
        columns = [array.to_numpy(zero_copy_only=False) for array in arrays]
        stacked = np.column_stack(columns) if len(batch) else np.empty((0, len(arrays)))
        return pa.FixedSizeListArray.from_arrays(pa.array(stacked.reshape(-1).astype(np.float32)), len(arrays))


class ArrayColumn(Features):
    """One array column of numbers, of one length in every row (for example a flat image)."""

    def aggregates(self):
        from pyspark.sql import functions as F

        array = F.col(self.features[0])
        return [F.min(F.size(array)).alias("min_length"), F.max(F.size(array)).alias("max_length"),
                F.count_if(F.exists(array, lambda value: value.isNull())).alias("null_elements")]

    def check_profile(self, profile, input_shape):
        column, rows, _ = self.noun
        if profile["null_elements"]:
            raise ColumnError(f"{column} {self.features[0]!r} has {profile['null_elements']} {rows[:-1]}(s) with "
                              "null elements: impute them first")
        self.check_widths(profile["min_length"], profile["max_length"])
        self.check_input(input_shape, profile["min_length"])

    def x(self, batch):
        column = batch.column(self.features[0])
        if column.null_count:
            raise ColumnError(f"{self.noun[0]} {self.features[0]!r} has null rows: drop them first")
        lengths = pc.min_max(pc.list_value_length(column))
        self.check_widths(lengths["min"].as_py(), lengths["max"].as_py())
        values = column.flatten()
        if values.null_count:
            raise ColumnError(f"{self.noun[0]} {self.features[0]!r} has null values inside its {self.noun[1]}")
        return pa.FixedSizeListArray.from_arrays(pc.cast(values, pa.float32()), lengths["min"].as_py() or 0)


class VectorColumn(ArrayColumn):
    """One Spark ML vector column (VectorUDT, dense or sparse, as VectorAssembler or sparklyr's
    ft_vector_assembler make it). Spark turns each vector into a dense array of float32 as the rows
    stream to Python (``vector_to_array``), so a sparse vector is dense one row at a time, never a
    whole partition."""

    noun = "vector column", "vectors", "size"

    def feature_projection(self, spark):
        name = self.features[0]
        return [vector_to_array(spark, name).alias(name)]

    def check_input(self, input_shape, width=None):
        if width is None or input_shape is None or None in input_shape or width == math.prod(input_shape):
            return
        raise ColumnError(f"vector column {self.features[0]!r} has vectors of size {width}, but the model takes "
                          f"{math.prod(input_shape)} values per row (input shape {tuple(input_shape)}): assemble "
                          "the features the model was built for, or change its input")


class ImageColumn(Features):
    """One binary column of encoded image files (PNG, JPEG, GIF, BMP), decoded in the training process."""

    stored = EncodedImages

    def check_input(self, input_shape, width=None):
        check_image_input(input_shape)

    def empty_x_type(self):
        return pa.binary()

    def x(self, batch):
        """The image column as a binary array (one encoded image file per row)."""
        name = self.features[0]
        column = batch.column(name)
        if column.null_count:
            raise ColumnError(f"image column {name!r} has null rows: drop them first")
        return column.cast(pa.binary()) if pa.types.is_large_binary(column.type) else column


def vector_to_array(spark, name):
    """Spark ML's vector_to_array (float32) of column ``name`` for ``spark``'s kind of session (pyspark's
    own choice follows a process-wide flag that a Spark Connect session sets, even beside a classic one)."""
    if cluster.is_connect(spark):
        from pyspark.ml.connect.functions import vector_to_array as convert
    else:
        from pyspark.ml.functions import vector_to_array

        convert = vector_to_array.__wrapped__  # the classic function under pyspark's Connect dispatch
    return convert(name, "float32")


def _is_numeric(data_type):
    from pyspark.sql.types import BooleanType, NumericType

    return isinstance(data_type, NumericType) and not isinstance(data_type, BooleanType)


def _is_vector(data_type):
    from pyspark.sql.types import UserDefinedType

    return isinstance(data_type, UserDefinedType) and type(data_type).__name__ == "VectorUDT"


def layout(schema, features, label=None, scoring=False, weight=None):
    """The layout of the training columns (``scoring``: the feature columns alone; ``weight``: a
    column of sample weights), or a ColumnError naming the column and the fix."""
    if isinstance(features, str):
        features = [features]
    if not features or not isinstance(features, (list, tuple)) or not all(isinstance(f, str) for f in features):
        raise InvalidArgumentError("features must be a column name or a non-empty list of column names")
    if not scoring and not isinstance(label, str):
        raise InvalidArgumentError(f"label must be a column name, got {label!r}")
    if weight is not None and not isinstance(weight, str):
        raise InvalidArgumentError(f"sample_weight must be a column name, got {weight!r}")
    types = {field.name: field.dataType for field in schema.fields}
    for name in [*features] + ([] if scoring else [label]):
        if name not in types:
            raise ColumnError(f"column {name!r} is not in the DataFrame; its columns are {sorted(types)}")
    if not scoring and not _is_numeric(types[label]):
        raise ColumnError(
            f"label column {label!r} has type {types[label].simpleString()}; it must be numeric "
            "(class ids as integers, or a float target): cast or index it first"
        )
    if weight is not None and not _is_numeric(types.get(weight)):
        raise ColumnError(f"sample_weight column {weight!r} must be a numeric column of the DataFrame"
                          + ("" if weight not in types else f", not {types[weight].simpleString()}"))
    return _kind(features, types)(features=tuple(features), label=None if scoring else label, weight=weight)


def _kind(features, types):
    from pyspark.sql.types import ArrayType, BinaryType, StructType

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
                "columns, one array column of numbers, one Spark ML vector column, or one binary column of "
                "encoded images"
            )
    return NumericColumns
