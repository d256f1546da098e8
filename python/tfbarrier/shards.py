"""One worker's data: Spark Arrow batches -> a local Arrow file -> a tf.data pipeline.

The task streams its partition batch by batch into an Arrow IPC file with two columns, ``x`` (a
fixed-size list of float32: one flat feature vector per row) and ``y`` (the label), so memory in the
task stays bounded by one batch. The training process memory-maps that file.
"""

import dataclasses
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import ColumnError


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which columns hold the features and the label (None when scoring). ``array_column`` is True when
    ``features`` is a single array column (for example a flat image); otherwise each feature is a
    numeric column."""

    features: tuple
    label: str
    array_column: bool

    @property
    def columns(self):
        return [*self.features, self.label] if self.label is not None else list(self.features)


def feature_matrix(batch, layout):
    """The batch's features as a FixedSizeListArray of float32 (one row per example)."""
    if layout.array_column:
        name = layout.features[0]
        column = batch.column(name)
        lengths = pc.min_max(pc.list_value_length(column))
        if column.null_count or lengths["min"].as_py() != lengths["max"].as_py():
            raise ColumnError(
                f"feature column {name!r} has null rows or arrays of different lengths; every row must "
                "be an array of the same length (filter or pad the data first)"
            )
        values = column.flatten()
        width = lengths["min"].as_py() or 0
    else:
        arrays = [batch.column(name) for name in layout.features]
        for name, array in zip(layout.features, arrays):
            if array.null_count:
                raise ColumnError(f"feature column {name!r} has null values: drop or impute them first")
        width = len(arrays)
        stacked = np.column_stack([a.to_numpy(zero_copy_only=False) for a in arrays]) if len(batch) else np.empty((0, width))
        values = pa.array(stacked.reshape(-1).astype(np.float32))
    if values.null_count:
        raise ColumnError(f"feature column {layout.features[0]!r} has null values inside its arrays")
    return pa.FixedSizeListArray.from_arrays(pc.cast(values, pa.float32()), width)


def _training_batch(batch, layout):
    """One Spark batch as the shard's (x, y) batch."""
    label = batch.column(layout.label)
    if label.null_count:
        raise ColumnError(f"label column {layout.label!r} has null values: drop those rows first")
    return pa.RecordBatch.from_arrays([feature_matrix(batch, layout), label], ["x", "y"])


def write(batches, path, layout):
    """Stream the partition's Arrow record batches to ``path`` as (x, y); return the rows written."""
    rows = write_partition((_training_batch(batch, layout) for batch in batches), path)
    if not os.path.exists(path):  # an empty partition still gets a (row-less) file
        pa.ipc.new_file(path, pa.schema([("x", pa.list_(pa.float32(), 1)), ("y", pa.float32())])).close()
    return rows


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


def to_numpy(matrix):
    """A FixedSizeListArray of float32 as a (rows, width) NumPy array (no copy when possible)."""
    return matrix.values.to_numpy(zero_copy_only=False).reshape(-1, matrix.type.list_size)


def read(path):
    """The shard as NumPy arrays ``(x, y)``: x is float32 of shape (rows, width)."""
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    features = to_numpy(table.column("x").combine_chunks())
    labels = table.column("y").combine_chunks().to_numpy(zero_copy_only=False)
    if labels.dtype == np.float64:
        labels = labels.astype(np.float32)
    return features, labels


def dataset_fn(x, y, input_shape, global_batch_size, seed, shuffle=True):
    """A function for ``strategy.distribute_datasets_from_function``: this worker's shard, shuffled
    (unless ``shuffle`` is False: rows in partition order), repeated without end (every worker runs
    the agreed number of steps, however small its shard) and batched to the per-replica share of
    the global batch."""
    import tensorflow as tf

    features = x.reshape((-1, *input_shape))

    def make(input_context):
        batch = input_context.get_per_replica_batch_size(global_batch_size)
        ds = tf.data.Dataset.from_tensor_slices((features, y))
        if shuffle:
            ds = ds.shuffle(min(len(features), 10_000), seed=seed, reshuffle_each_iteration=True)
        ds = ds.repeat().batch(batch, drop_remainder=True)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.with_options(options).prefetch(tf.data.AUTOTUNE)

    return make
