"""One worker's data: Spark Arrow batches -> a local Arrow file -> a streaming tf.data pipeline.

The task streams its partition batch by batch into an Arrow IPC file with two columns, ``x`` and
``y`` (the label), in record batches of at most ``RECORD_BATCH_BYTES``, so memory in the task stays
bounded by one Spark batch. ``x`` is held as the layout stores it (stored_forms.STORED_FORMS: a fixed-size
list of float32 or int64, one flat feature vector per row; for encoded images, the image file's bytes;
a struct of those, one per model input), ``y`` as a label column or a struct of one per model output (a
sequence label a fixed-size list per row), a ``w`` of sample weights when the fit has them (one per row, or
one per position), and read back the same way: nothing here depends on which.

The training process streams that file into tf.data one record batch at a time and never holds the
whole shard: each pass reads the record batches in a fresh seeded order, mixes rows through a
bounded shuffle buffer (tf.data's), and decodes images in a parallel map. The file is read with
``pread``, not memory-mapped: mapped pages count in a process's resident memory until it unmaps them.
"""

import dataclasses
import hashlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfbarrier.data import text
from tfbarrier.data.stored_forms import (label_bytes, label_dtype, label_spec, label_zeros, labels_to_numpy, rows_of,
                                         stored_form, take)

RECORD_BATCH_BYTES = 4 * 2**20  # a shard's record batches: the unit the reader reads and reorders
SHUFFLE_BUFFER_ROWS = 10_000  # the default shuffle buffer, in rows...
SHUFFLE_BUFFER_BYTES = 64 * 2**20  # ...and at most this many bytes of the shard's rows
PREFETCH_BATCHES = 2  # batches a worker's pipeline prepares ahead of its steps


def _training_batch(batch, layout):
    """One Spark batch as the shard's (x, y) batch, or (x, y, w) with sample weights."""
    label = layout.y(batch)
    x = layout.x(batch)
    if layout.weight is None:
        return pa.RecordBatch.from_arrays([x, label], ["x", "y"])
    return pa.RecordBatch.from_arrays([x, label, layout.w(batch)], ["x", "y", "w"])


def _bounded(batches):
    """The record batches re-sliced to at most RECORD_BATCH_BYTES (at least one row) each."""
    for batch in batches:
        rows = max(1, int(len(batch) * RECORD_BATCH_BYTES / max(1, batch.nbytes)))
        for start in range(0, len(batch), rows):
            yield batch.slice(start, rows)


def _digest(digest, batch):
    x = batch.column(0)
    for value in stored_form(x.type).bytes_of(x):
        digest.update(value)
    for column in batch.columns[1:]:
        digest.update(label_bytes(column))


class _ShardFile:
    """A shard file being written: (x, y) record batches of at most RECORD_BATCH_BYTES, of one feature
    width, digested in order."""

    def __init__(self, path, layout):
        self.path, self.layout = path, layout
        self.rows, self.digest, self.widths, self.writer = 0, hashlib.sha256(), set(), None

    def add(self, batch):
        """One Spark record batch's rows (none: nothing to write, e.g. no validation row in the batch)."""
        if not len(batch):
            return
        for piece in _bounded([_training_batch(batch, self.layout)]):
            x_type = piece.schema.field("x").type
            width = stored_form(x_type).width(x_type)
            if isinstance(width, int):  # NamedRows' {input: width}: NamedInputs.x checked each
                self.widths.add(width)
                self.layout.check_widths(min(self.widths), max(self.widths))
            _digest(self.digest, piece)
            if self.writer is None:
                self.writer = pa.ipc.new_file(self.path, piece.schema)
            self.writer.write_batch(piece)
            self.rows += len(piece)

    def close(self):
        """(rows, checksum); a shard without rows is still a (row-less) file."""
        if self.writer is None:
            fields = [("x", self.layout.empty_x_type()), ("y", self.layout.empty_y_type())] + ([("w", pa.float32())] if self.layout.weight else [])
            self.writer = pa.ipc.new_file(self.path, pa.schema(fields))
        self.writer.close()
        return self.rows, self.digest.hexdigest()


def write(batches, path, layout, validation=None):
    """Stream the partition's Arrow record batches to ``path`` as (x, y). Returns (rows, checksum):
    the rows written and a digest of them, in order. ``validation``, a pair (path, held_out), sends
    the rows ``held_out(batch)`` marks (a boolean array per Spark batch) to a validation shard at that
    path instead; then returns ((rows, checksum), (validation rows, checksum))."""
    training = _ShardFile(path, layout)
    held = _ShardFile(validation[0], layout) if validation else None
    try:
        for batch in batches:
            if held is not None:
                mask = validation[1](batch)
                held.add(batch.filter(mask))
                batch = batch.filter(pc.invert(mask))
            training.add(batch)
    finally:
        written = training.close(), held.close() if held is not None else None
    return written if held is not None else written[0]


def write_partition(batches, path):
    """Stream record batches to an Arrow file at ``path``, one batch in memory at a time (as they come
    for ``apply``); return the row count. No batches, no file."""
    rows = 0
    writer = None
    try:
        for batch in batches:
            if writer is None:
                writer = pa.ipc.new_file(path, batch.schema)
            writer.write_batch(batch)
            rows += len(batch)
    finally:
        if writer is not None:
            writer.close()
    return rows


def read_partition(path, schema):
    """The partition written by ``write_partition`` as a pandas DataFrame (``schema`` when it was empty)."""
    if not os.path.exists(path):
        return schema.empty_table().to_pandas()
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all().to_pandas()


@dataclasses.dataclass(frozen=True)
class Shard:
    """A shard file, described from its footer without reading its rows."""

    path: str
    rows: int
    record_batches: int
    width: int  # feature values per row; None for rows without one (encoded images)
    label_dtype: object  # a NumPy dtype, or {output name: dtype}
    bytes_per_row: float
    weighted: bool = False  # rows carry a sample weight (w)
    weight_length: int = None  # ...a weight per position of a sequence label, that many; None: one per row
    stored: object = None  # how x is held (stored_forms.STORED_FORMS)
    text: object = None  # a text column's text.Preprocessing: the model's own preprocessor, batch by batch

    @classmethod
    def open(cls, path, rows):
        """The shard ``write`` wrote to ``path`` (``rows``: what it returned)."""
        with pa.OSFile(path) as source:
            reader = pa.ipc.open_file(source)
            x_type = reader.schema.field("x").type
            stored = stored_form(x_type)
            return cls(path=path, rows=rows, record_batches=reader.num_record_batches,
                       width=stored.width(x_type), stored=stored,
                       label_dtype=label_dtype(reader.schema.field("y").type),
                       bytes_per_row=os.path.getsize(path) / max(1, rows),
                       weighted="w" in reader.schema.names, weight_length=_list_size(reader.schema, "w"))

    def batches(self, order):
        """(x, y) NumPy arrays of the record batches in ``order``, read one at a time, and w (float32)
        when the rows are weighted: x as ``stored.to_numpy`` makes it (float32 (rows, width), encoded images...)."""
        with pa.OSFile(self.path) as source:
            reader = pa.ipc.open_file(source)
            for i in order:
                batch = reader.get_batch(int(i))
                x = batch.column(0)
                x = self.stored.to_numpy(x)
                y = labels_to_numpy(batch.column(1), self.label_dtype)
                yield (x, y, self._weights(batch.column(2))) if self.weighted else (x, y)

    def _weights(self, column):
        values = (column.flatten() if self.weight_length else column).to_numpy(zero_copy_only=False)
        return values.reshape(-1, self.weight_length) if self.weight_length else values

    def weights(self, count, value):
        """``count`` rows' sample weights, each ``value``: of the shape this shard's weights have."""
        return np.full((count, self.weight_length) if self.weight_length else count, value, np.float32)

    def weight_spec(self, tf):
        """The tf.data spec of a batch of this shard's sample weights."""
        return tf.TensorSpec((None, self.weight_length) if self.weight_length else (None,), tf.float32)

    def one_pass(self, shuffle, seed, pass_number):
        """(x, y) of every row once: the record batches as written, or with ``shuffle`` in an order drawn
        afresh for each pass (seeded by ``seed`` and the pass number). The rows of a one-batch shard are
        permuted here too, since tf.data's seeded shuffle would otherwise repeat one order every pass."""
        if not shuffle:
            yield from self.batches(range(self.record_batches))
            return
        rng = np.random.default_rng(None if seed is None else [seed, int(pass_number)])
        for arrays in self.batches(rng.permutation(self.record_batches)):
            if self.record_batches == 1:
                rows = rng.permutation(rows_of(arrays[0]))
                arrays = tuple(take(a, rows) for a in arrays)
            yield arrays

    def first_unreadable(self, input_shape):
        """(position in the partition, reason) of the shard's first row the model cannot take (an image
        that does not decode), else None; without reading the shard when its rows are not decoded."""
        if not self.stored.decoded:
            return None
        offset = 0
        for x, *_ in self.batches(range(self.record_batches)):
            found = self.stored.first_unreadable(x, input_shape)
            if found is not None:
                return offset + found[0], found[1]
            offset += rows_of(x)
        return None

    def shuffle_buffer(self, requested, batch):
        """Rows in the shuffle buffer: ``requested``, or by default SHUFFLE_BUFFER_ROWS but no more than
        SHUFFLE_BUFFER_BYTES of this shard's rows; never less than one batch nor more than the shard."""
        rows = requested or min(SHUFFLE_BUFFER_ROWS, int(SHUFFLE_BUFFER_BYTES / self.bytes_per_row))
        return max(1, min(max(rows, batch), self.rows))


def _list_size(schema, name):
    """The size of field ``name``'s fixed-size lists; None when it is not one (or not there)."""
    field = schema.field(name) if name in schema.names else None
    return field.type.list_size if field is not None and pa.types.is_fixed_size_list(field.type) else None


def _signature(shard, input_shape, present=False):
    """A generator's output signature: x, y, then (``present``) a float32 per row, then the sample weights."""
    import tensorflow as tf

    x_spec = shard.stored.spec(tf, input_shape)
    weights = [shard.weight_spec(tf)] if present or shard.weighted else []
    return (x_spec, label_spec(tf, shard.label_dtype), *[tf.TensorSpec((None,), tf.float32)] * present, *weights)


def _batched(ds, shard, input_shape, batch, then=None, validation=False):
    """Rows -> what the strategy takes: x made ready (images decoded in parallel), ``then`` (a map) applied, batches of
    ``batch`` rows (every one full), texts made the model's inputs by its preprocessor (``validation``: batches of
    validation_dataset_fn's), tf.data's auto-sharding off (each worker has its own shard), prefetched."""
    import tensorflow as tf

    ds = shard.stored.prepared(tf, ds, input_shape)
    if then is not None:
        ds = ds.map(then, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch, drop_remainder=True)
    if shard.text is not None:
        ds = text.preprocessed(ds, shard.text, validation)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # No autotuning: its thread's measurements compete for the cores a worker's step needs (a worker
    # has one, bench/README.md), for a pipeline whose only tunable part is this prefetch.
    options.autotune.enabled = False
    return ds.with_options(options).prefetch(PREFETCH_BATCHES)


def class_weighted(class_weight):
    """A tf.data map giving each row the weight of its class (classes not in ``class_weight`` weigh 1),
    times its sample weight when it has one: Keras's class_weight, done where the data is."""
    import tensorflow as tf

    size = max(class_weight) + 1
    table = tf.constant([float(class_weight.get(c, 1.0)) for c in range(size)], tf.float32)

    def weigh(x, y, *sample_weight):
        index = tf.cast(y, tf.int32)
        weight = tf.where(index < size, tf.gather(table, tf.minimum(index, size - 1)), 1.0)
        return x, y, weight * sample_weight[0] if sample_weight else weight

    return weigh


def dataset_fn(shard, input_shape, global_batch_size, seed, shuffle=True, shuffle_buffer=None, class_weight=None,
               skip_rows=0):
    """A function for ``strategy.distribute_datasets_from_function``: this worker's shard, streamed
    (see the module's docstring), repeated without end (every worker runs the agreed number of
    steps, however small its shard) and batched to the per-replica share of the global batch.
    With ``shuffle`` False, rows come in partition order, pass after pass. Elements are (x, y), or
    (x, y, sample weight) with sample weights or ``class_weight`` ({class: weight}). The stream is the
    same for the same ``seed``: ``skip_rows`` starts it where a resumed fit left it (checkpoints.py)."""
    import tensorflow as tf

    signature = _signature(shard, input_shape)

    def one_pass_batches(pass_number):
        for x, *rest in shard.one_pass(shuffle, seed, pass_number):
            yield shard.stored.model_x(x, input_shape), *rest

    def make(input_context):
        batch = input_context.get_per_replica_batch_size(global_batch_size)
        buffer = shard.shuffle_buffer(shuffle_buffer, batch)

        def one_pass(pass_number):
            rows = tf.data.Dataset.from_generator(one_pass_batches, args=(pass_number,),
                                                  output_signature=signature).unbatch()
            if shuffle:  # within the pass, so every row comes once per pass. The seed stays a Python
                # int (a tensor seed breaks once a global seed of 0 is set): one_pass varies the input.
                rows = rows.shuffle(buffer, seed=seed)
            return rows

        # The generator only reads: rows are mixed and batched by tf.data's C++, which leaves the GIL to
        # Keras's own Python between steps (a worker held up there holds up every worker's collectives).
        ds = tf.data.Dataset.range(0 if shard.rows == 0 else np.iinfo(np.int64).max).flat_map(one_pass)
        if skip_rows:
            ds = ds.skip(skip_rows)
        # Images are decoded after the shuffle.
        return _batched(ds, shard, input_shape, batch, class_weighted(class_weight) if class_weight else None)

    return make


def validation_dataset_fn(shard, input_shape, global_batch_size, steps):
    """A function for ``strategy.distribute_datasets_from_function``: this worker's validation shard
    as (x, y, present, sample weight) batches of the per-replica batch size, every row once and in order
    (present 1; weight 1 without sample weights), then padding rows (present 0) up to exactly ``steps``
    steps (rendezvous.validation_steps), so that every worker runs the same steps whatever its rows."""
    import tensorflow as tf

    signature = _signature(shard, input_shape, present=True)

    def make(input_context):
        batch = input_context.get_per_replica_batch_size(global_batch_size)
        local_replicas = input_context.num_replicas_in_sync // input_context.num_input_pipelines
        padding = steps * local_replicas * batch - shard.rows
        def rows():
            for x, y, *weight in shard.batches(range(shard.record_batches)):
                rows = rows_of(x)
                yield (shard.stored.model_x(x, input_shape), y, np.ones(rows, np.float32),
                       weight[0] if weight else shard.weights(rows, 1))
            if padding:
                x = shard.stored.padding(tf, padding, input_shape)
                yield x, label_zeros(padding, shard.label_dtype), np.zeros(padding, np.float32), shard.weights(padding, 0)

        return _batched(tf.data.Dataset.from_generator(rows, output_signature=signature).unbatch(), shard,
                        input_shape, batch, validation=True)

    return make
