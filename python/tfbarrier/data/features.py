"""Feature layouts: which columns of a DataFrame hold a row's features, and how they become the model's input.

``layout`` chooses one from the DataFrame's schema on the driver, and the job carries it to the tasks.
Each kind owns its whole path, so a new kind of feature column is one class here:

- ``projection``: the Spark columns a stage selects (a vector column is turned into an array there);
- ``aggregates`` and ``check_profile``: what the driver's one aggregate pass measures, and refuses;
- ``x``: how a Spark Arrow batch becomes the shard's ``x`` (in the task) or the scored rows;
- ``check_input``: whether rows fill the model's input, wherever the model's input shape is known;
- ``y``: the label column, or a struct of one label column per model output (``label={output: column}``);
  a label of arrays (a sequence label: a value per position) as a fixed-size list per row, and ``w`` the
  sample weights, one per row or one per position of a sequence label.

How the shard holds x and y, and how a training process reads them back, is stored_forms.py's.

The kinds: numeric columns (``NumericColumns``), one array column of numbers (``ArrayColumn``), one
Spark ML vector column, dense or sparse (``VectorColumn``), one binary column of encoded images
(``ImageColumn``), one string column that the model's own preprocessor reads (text.TextColumn), and one
column per model input (named_inputs.NamedInputs: ``features={input: column}``).
"""

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfbarrier.errors import ColumnError, ModelError
from tfbarrier.spark import cluster

IMAGE_CHANNELS = (1, 3, 4)


def single_input(input_shape):
    """``input_shape``; a ModelError when it is several inputs' ({name: shape}), which take a column each."""
    if isinstance(input_shape, dict):
        names = ", ".join(f'"{name}": "<column>"' for name in input_shape)
        raise ModelError(f"the model has {len(input_shape)} inputs: give features= one column for each, by the "
                         f"input's name ({{{names}}}; name them with keras.Input(name=...))")
    return input_shape


def check_width(width, input_shape):
    """Refuse rows of ``width`` values that do not fill the model's per-sample ``input_shape``."""
    input_shape = single_input(input_shape)
    if width is None or input_shape is None or None in input_shape:
        return
    needed = math.prod(input_shape)
    if width != needed:
        raise ModelError(
            f"each row has {width} feature values but the model's input shape {tuple(input_shape)} needs "
            f"{needed}: choose the matching feature columns or change the model's input"
        )


def array_aggregates(names, alias):
    """Spark aggregates of the array columns ``names``: each one's shortest and longest row and its rows with
    null elements, named ``alias(what, i)`` (``what`` min_length, max_length, null_elements; column i)."""
    from pyspark.sql import functions as F

    found = []
    for i, name in enumerate(names):
        array = F.col(name)
        found += [F.min(F.size(array)).alias(alias("min_length", i)),
                  F.max(F.size(array)).alias(alias("max_length", i)),
                  F.count_if(F.exists(array, lambda value: value.isNull())).alias(alias("null_elements", i))]
    return found


def fixed_rows(array, what):
    """A list column whose rows all have one length as a fixed-size list (a ColumnError naming ``what`` if not)."""
    if pa.types.is_fixed_size_list(array.type):
        return array
    lengths = pc.list_value_length(array)
    shortest, longest = pc.min(lengths).as_py(), pc.max(lengths).as_py()
    if shortest != longest:
        raise ColumnError(f"{what} holds arrays of different lengths ({shortest} to {longest}): pad them to one length")
    values = array.flatten()
    if values.null_count:
        raise ColumnError(f"{what} has arrays with null elements: fill them first")
    return pa.FixedSizeListArray.from_arrays(values, longest or 0)


def value_column(batch, name, what):
    """Column ``name`` of ``batch`` (a ``what``: one value a row, bytes or text) without nulls, a large Arrow
    type made the plain one (stored_forms.ValueRows)."""
    column = batch.column(name)
    if column.null_count:
        raise ColumnError(f"{what} {name!r} has null rows: drop them first")
    plain = {pa.large_binary(): pa.binary(), pa.large_string(): pa.string()}.get(column.type)
    return column if plain is None else column.cast(plain)


def check_image_input(input_shape):
    """Refuse a model that cannot take decoded images: its input must be (height, width, channels)."""
    if single_input(input_shape) is None:
        return
    shape = tuple(input_shape)
    if len(shape) != 3 or None in shape or shape[2] not in IMAGE_CHANNELS:
        raise ModelError(
            f"the features are encoded images, so the model's input shape must be (height, width, channels) "
            f"with 1, 3 or 4 channels (images are resized to it), got {shape}; e.g. keras.Input((224, 224, 3))"
        )


@dataclasses.dataclass(frozen=True)
class Features:
    """The feature columns, the label (None when scoring) and the sample weights' column (or None). With
    ``outputs`` (output names), ``label`` is a tuple of columns, one per output; with ``inputs`` (input
    names, NamedInputs), ``features`` holds one column per input."""

    features: tuple
    label: object = None  # a column name, or a tuple of them (one per output)
    weight: str = None
    inputs: tuple = None
    outputs: tuple = None
    sequences: tuple = ()  # the label and weight columns that hold an array per row (a value per position)
    noun = "feature column", "arrays", "length"  # how messages name the column, its rows, their width
    takes_text = False  # the model's own preprocessor makes its inputs from strings (TextColumn)

    @property
    def labels(self):
        """The label columns (none when scoring)."""
        return () if self.label is None else (self.label,) if isinstance(self.label, str) else tuple(self.label)

    @property
    def named(self):
        """Several inputs or outputs, by name: only a Keras 3 model that trains natively takes them."""
        return self.inputs is not None or self.outputs is not None

    @property
    def columns(self):
        """The training columns' names, as the projection names them."""
        return [*self.features, *self.labels, *([self.weight] if self.weight is not None else [])]

    def y(self, batch):
        """The batch's labels: the label column, or a struct of one per output; a sequence label as a
        fixed-size list per row."""
        arrays = []
        for name in self.labels:
            array = batch.column(name)
            if array.null_count:
                raise ColumnError(f"label column {name!r} has null values: drop those rows first")
            arrays.append(fixed_rows(array, f"label column {name!r}") if name in self.sequences else array)
        return arrays[0] if self.outputs is None else pa.StructArray.from_arrays(arrays, list(self.outputs))

    def w(self, batch):
        """The batch's sample weights as float32: one per row, or a fixed-size list per row (per position)."""
        weight = batch.column(self.weight)
        if weight.null_count:
            raise ColumnError(f"sample_weight column {self.weight!r} has null values: drop or fill them first")
        if self.weight in self.sequences:
            weight = fixed_rows(weight, f"sample_weight column {self.weight!r}")
            return pa.FixedSizeListArray.from_arrays(pc.cast(weight.flatten(), pa.float32()), weight.type.list_size)
        return pc.cast(weight, pa.float32())

    def sequence_aggregates(self):
        """Spark aggregates of the sequence columns (array_aggregates')."""
        return array_aggregates(self.sequences, lambda what, i: f"sequence_{what}_{i}")

    def check_sequences(self, profile):
        """Refuse sequence columns whose rows differ in length, or hold null elements, or differ from each other."""
        lengths = {}
        for i, name in enumerate(self.sequences):
            nulls = profile.get(f"sequence_null_elements_{i}")
            if nulls:
                raise ColumnError(f"column {name!r} has {nulls} array(s) with null elements: fill them first (a weight "
                                  "of 0 leaves a position out)")
            shortest, longest = profile.get(f"sequence_min_length_{i}"), profile.get(f"sequence_max_length_{i}")
            if shortest != longest:
                raise ColumnError(f"column {name!r} holds arrays of different lengths ({shortest} to {longest}); a "
                                  "sequence label and its weights need one length: pad them to the model's sequence "
                                  "length, with a weight of 0 for the padding positions")
            lengths[name] = longest
        if len(set(lengths.values())) > 1:
            raise ColumnError(f"the sequence columns differ in length ({lengths}): a position's weight must match "
                              "its label's")

    def empty_y_type(self):
        """The type of ``y`` in a shard without rows (a validation shard's takes its training rows' form)."""
        if self.outputs is None:
            return pa.float32()
        return pa.struct([(name, pa.float32()) for name in self.outputs])

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

    def widths(self, profile):
        """{model input name, or None for a model's one input: values a row} as the profile found them."""
        return {}

    def check_widths(self, shortest, longest, name=None):
        """Refuse rows of different widths (feature values per row) in column ``name`` (the first feature's)."""
        column, rows, length = self.noun
        if shortest != longest:
            raise ColumnError(f"{column} {name or self.features[0]!r} holds {rows} of different {length}s ({shortest} "
                              f"to {longest}); every row must have the same {length} (filter or pad first)")

    def flat_values(self, column, name):
        """(the values of array column ``name``'s rows, flat; values a row), its rows checked to be of one
        length and its values not null."""
        lengths = pc.min_max(pc.list_value_length(column))
        self.check_widths(lengths["min"].as_py(), lengths["max"].as_py(), name)
        values = column.flatten()
        if values.null_count:
            raise ColumnError(f"{self.noun[0]} {name!r} has null values inside its {self.noun[1]}")
        return values, lengths["min"].as_py() or 0

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
        return array_aggregates(self.features[:1], lambda what, i: what)

    def check_profile(self, profile, input_shape):
        column, rows, _ = self.noun
        if profile["null_elements"]:
            raise ColumnError(f"{column} {self.features[0]!r} has {profile['null_elements']} {rows[:-1]}(s) with "
                              "null elements: impute them first")
        self.check_widths(profile["min_length"], profile["max_length"])
        self.check_input(input_shape, profile["min_length"])

    def widths(self, profile):
        return {None: profile["min_length"]}

    def x(self, batch):
        column = batch.column(self.features[0])
        if column.null_count:
            raise ColumnError(f"{self.noun[0]} {self.features[0]!r} has null rows: drop them first")
        values, width = self.flat_values(column, self.features[0])
        return pa.FixedSizeListArray.from_arrays(pc.cast(values, pa.float32()), width)


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
        if width is None or single_input(input_shape) is None or None in input_shape or width == math.prod(input_shape):
            return
        raise ColumnError(f"vector column {self.features[0]!r} has vectors of size {width}, but the model takes "
                          f"{math.prod(input_shape)} values per row (input shape {tuple(input_shape)}): assemble "
                          "the features the model was built for, or change its input")


class ImageColumn(Features):
    """One binary column of encoded image files (PNG, JPEG, GIF, BMP), decoded in the training process."""

    def check_input(self, input_shape, width=None):
        check_image_input(input_shape)

    def empty_x_type(self):
        return pa.binary()

    def x(self, batch):
        """The image column as a binary array (one encoded image file per row)."""
        return value_column(batch, self.features[0], "image column")


def vector_to_array(spark, name):
    """Spark ML's vector_to_array (float32) of column ``name`` for ``spark``'s kind of session (pyspark's
    own choice follows a process-wide flag that a Spark Connect session sets, even beside a classic one)."""
    if cluster.is_connect(spark):
        from pyspark.ml.connect.functions import vector_to_array as convert
    else:
        from pyspark.ml.functions import vector_to_array

        convert = vector_to_array.__wrapped__  # the classic function under pyspark's Connect dispatch
    return convert(name, "float32")
