"""How a shard holds a row's features (x) and labels (y), and how a training process, or predict's task,
reads them back: the process-side half of a feature layout (features.py), TensorFlow passed in.

- ``FloatRows``: a fixed-size list of float32 per row, one flat feature vector reshaped to the model's input;
- ``IntRows``: the same of int64, for integer ids (tokens, categories), which reach the model as integers;
- ``EncodedImages``: one encoded image file per row, decoded after the shuffle;
- ``Texts``: one string per row, which the model's own preprocessor turns into its inputs (data/text.py);
- ``NamedRows``: a struct with a field per model input (``features={input: column}``), each field in one
  of the forms above, read back as {input name: rows}.

Labels are a numeric column, a fixed-size list per row (a sequence label, ``SequenceLabel``), or a struct with a
field per model output (``label={output: column}``): ``labels_to_numpy`` and ``label_spec`` read each.
"""

import dataclasses

import numpy as np
import pyarrow as pa


class FloatRows:
    """x as a fixed-size list of float32 per row: one flat feature vector, reshaped to the model's input."""

    decoded = False  # rows reach the model as they are: none can fail to be read

    @staticmethod
    def matches(x_type):
        return pa.types.is_fixed_size_list(x_type) and not pa.types.is_integer(x_type.value_type)

    @staticmethod
    def width(x_type):
        """Feature values per row (checked as rows are written), or None when rows have no width."""
        return x_type.list_size

    @staticmethod
    def to_numpy(column):
        """A FixedSizeListArray of float32 as a (rows, width) NumPy array (no copy when possible)."""
        # flatten, not .values: a sliced array's values are its parent's, every row
        return column.flatten().to_numpy(zero_copy_only=False).reshape(-1, column.type.list_size)

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


class ValueRows:
    """x as one variable-length value per row (a file's bytes, a text), held as NumPy objects and reaching
    TensorFlow as tf.string: the parts of EncodedImages and Texts that are the same."""

    @staticmethod
    def width(x_type):
        return None

    @staticmethod
    def to_numpy(column):
        return column.to_numpy(zero_copy_only=False)

    @staticmethod
    def model_x(x, input_shape):
        return x

    @staticmethod
    def spec(tf, input_shape):
        return tf.TensorSpec((None,), tf.string)


class EncodedImages(ValueRows):
    """x as one encoded image file per row, decoded (images.py) after the shuffle, in parallel."""

    decoded = True  # a row that does not decode fails the pipeline: first_unreadable finds it

    @staticmethod
    def matches(x_type):
        return pa.types.is_binary(x_type)

    @staticmethod
    def bytes_of(column):
        return column.to_pylist()

    @staticmethod
    def prepared(tf, ds, input_shape):
        from tfbarrier.data.images import decode_image

        return ds.map(lambda x, *rest: (decode_image(x, input_shape), *rest), num_parallel_calls=tf.data.AUTOTUNE)

    @staticmethod
    def scoring_input(tf, rows, input_shape, batch_size):
        """Batches of the images decoded in a parallel tf.data map."""
        from tfbarrier.data.images import decode_image

        return (tf.data.Dataset.from_tensor_slices(rows)
                .map(lambda data: decode_image(data, input_shape), num_parallel_calls=tf.data.AUTOTUNE)
                .batch(batch_size))

    @staticmethod
    def padding(tf, count, input_shape):
        blank = tf.io.encode_png(tf.zeros((1, 1, input_shape[-1]), tf.uint8)).numpy()  # any image that decodes
        return np.array([blank] * count, dtype=object)

    @staticmethod
    def first_unreadable(rows, input_shape):
        from tfbarrier.data.images import undecodable_row

        return undecodable_row(rows, input_shape)


class Texts(ValueRows):
    """x as one string per row (UTF-8), which the model's own preprocessor (a KerasHub task's tokenizer and
    packer) turns into the model's inputs batch by batch: text.py maps it in a training process, and a task's
    ``predict_on_batch`` runs it when scoring."""

    decoded = False

    @staticmethod
    def matches(x_type):
        return pa.types.is_string(x_type)

    @staticmethod
    def bytes_of(column):
        return [value.encode() for value in column.to_pylist()]

    @staticmethod
    def prepared(tf, ds, input_shape):
        return ds

    @staticmethod
    def scoring_input(tf, rows, input_shape, batch_size):
        """Batches of the strings, which the model's preprocessor tokenizes (a task's ``predict_on_batch``)."""
        return tf.data.Dataset.from_tensor_slices(rows.astype(object)).batch(batch_size)

    @staticmethod
    def padding(tf, count, input_shape):
        return np.array([""] * count, dtype=object)

    @staticmethod
    def first_unreadable(rows, input_shape):
        return None


class IntRows(FloatRows):
    """x as a fixed-size list of int64 per row: integer columns and arrays of integers (token ids, category
    ids) reach the model as integers, exact beyond float32's 2**24."""

    @staticmethod
    def matches(x_type):
        return pa.types.is_fixed_size_list(x_type) and pa.types.is_integer(x_type.value_type)

    @staticmethod
    def spec(tf, input_shape):
        return tf.TensorSpec((None, *input_shape), tf.int64)

    @staticmethod
    def padding(tf, count, input_shape):
        return np.zeros((count, *input_shape), np.int64)


class NamedRows:
    """x as a struct of one field per model input, each field held in its own form (``FloatRows``,
    ``IntRows``): read back as {input name: rows}, each reshaped to its input's shape where the model
    gives one (else (width,)). Made for one struct type (``stored_form``)."""

    decoded = False

    def __init__(self, x_type):
        self.forms = {field.name: stored_form(field.type) for field in x_type}
        self.widths = {field.name: self.forms[field.name].width(field.type) for field in x_type}

    @staticmethod
    def matches(x_type):
        return pa.types.is_struct(x_type)

    @staticmethod
    def width(x_type):
        """{input name: its values a row}."""
        return {field.name: stored_form(field.type).width(field.type) for field in x_type}

    def to_numpy(self, column):
        return {name: form.to_numpy(column.field(name)) for name, form in self.forms.items()}

    def bytes_of(self, column):
        return [data for name, form in self.forms.items() for data in form.bytes_of(column.field(name))]

    def shape(self, input_shape, name):
        """Input ``name``'s per-sample shape: the model's (``input_shape``: {name: shape}, or one shape for
        a model of one input), else (width,) when the model does not fix it."""
        if isinstance(input_shape, dict):
            input_shape = input_shape.get(name)
        elif len(self.forms) > 1:
            input_shape = None
        if input_shape is None or None in tuple(input_shape):
            return (self.widths[name],)
        return tuple(input_shape)

    def model_x(self, x, input_shape):
        return {name: form.model_x(x[name], self.shape(input_shape, name)) for name, form in self.forms.items()}

    def spec(self, tf, input_shape):
        return {name: form.spec(tf, self.shape(input_shape, name)) for name, form in self.forms.items()}

    @staticmethod
    def prepared(tf, ds, input_shape):
        return ds

    def scoring_input(self, tf, rows, input_shape, batch_size):
        return tf.data.Dataset.from_tensor_slices(self.model_x(rows, input_shape)).batch(batch_size)

    def padding(self, tf, count, input_shape):
        return {name: form.padding(tf, count, self.shape(input_shape, name)) for name, form in self.forms.items()}

    @staticmethod
    def first_unreadable(rows, input_shape):
        return None


STORED_FORMS = (IntRows, FloatRows, EncodedImages, Texts, NamedRows)


def stored_form(x_type):
    """How a shard whose x column has ``x_type`` holds its rows: one of STORED_FORMS (NamedRows made for
    ``x_type``)."""
    form = next(form for form in STORED_FORMS if form.matches(x_type))
    return form(x_type) if form is NamedRows else form


def rows_of(x):
    """The number of rows of ``x`` (an array, or {name: array})."""
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


def take(x, rows):
    """``x``'s rows at ``rows`` (an index array), for an array or {name: array}."""
    return {name: values[rows] for name, values in x.items()} if isinstance(x, dict) else x[rows]


# ---- labels: one numeric column, or a struct of one per output; a sequence label a fixed-size list per row ----

@dataclasses.dataclass(frozen=True)
class SequenceLabel:
    """The labels of a sequence label column: ``length`` values of ``dtype`` per row (a value per position)."""

    dtype: np.dtype
    length: int


def label_dtype(arrow_type):
    """The NumPy dtype labels of ``arrow_type`` reach the model as (float64 as float32), a SequenceLabel for
    a fixed-size list per row, or {output name: either} for a struct of labels."""
    if pa.types.is_struct(arrow_type):
        return {field.name: label_dtype(field.type) for field in arrow_type}
    if pa.types.is_fixed_size_list(arrow_type):
        return SequenceLabel(label_dtype(arrow_type.value_type), arrow_type.list_size)
    dtype = np.dtype(arrow_type.to_pandas_dtype())
    return np.dtype(np.float32) if dtype == np.float64 else dtype


def labels_to_numpy(column, dtype):
    """A label column (or struct of them) as a NumPy array of ``dtype`` (or {output name: array})."""
    if isinstance(dtype, dict):
        return {name: labels_to_numpy(column.field(name), each) for name, each in dtype.items()}
    if isinstance(dtype, SequenceLabel):
        return labels_to_numpy(column.flatten(), dtype.dtype).reshape(-1, dtype.length)
    return column.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def label_bytes(column):
    """A label (or weight) column's values as bytes, in order (for a shard's digest)."""
    if pa.types.is_struct(column.type):
        return b"".join(label_bytes(column.field(i)) for i in range(column.type.num_fields))
    if pa.types.is_fixed_size_list(column.type):
        return label_bytes(column.flatten())  # flatten: the values of these rows alone, a slice's too
    return column.to_numpy(zero_copy_only=False).tobytes()


def label_spec(tf, dtype):
    """The tf.data spec of a batch of labels of ``dtype`` (or {output name: dtype})."""
    if isinstance(dtype, dict):
        return {name: label_spec(tf, each) for name, each in dtype.items()}
    if isinstance(dtype, SequenceLabel):
        return tf.TensorSpec((None, dtype.length), tf.as_dtype(dtype.dtype))
    return tf.TensorSpec((None,), tf.as_dtype(dtype))


def label_zeros(count, dtype):
    """``count`` padding labels of ``dtype`` (or {output name: dtype})."""
    if isinstance(dtype, dict):
        return {name: label_zeros(count, each) for name, each in dtype.items()}
    if isinstance(dtype, SequenceLabel):
        return np.zeros((count, dtype.length), dtype.dtype)
    return np.zeros(count, dtype)
