"""The shard file and its streaming tf.data reader, in this process (no Spark): the batches it yields
with and without shuffling, and that it reads the shard record batch by record batch."""

import numpy as np
import pyarrow as pa
import pytest

from tfbarrier.data import shards
from tfbarrier.data.features import ArrayColumn

WIDTH = 6


def write_shard(tmp_path, name, rows, start=0):
    """A shard of ``rows`` rows whose row i has features [start + i] * WIDTH and label start + i,
    written from Spark-like batches of 7 rows."""
    values = np.arange(start, start + rows, dtype=np.float32)
    batches = [pa.RecordBatch.from_pydict({"f": [[v] * WIDTH for v in values[i:i + 7]],
                                           "label": values[i:i + 7].astype(np.int64)})
               for i in range(0, rows, 7)]
    path = str(tmp_path / name)
    written, _ = shards.write(batches, path, ArrayColumn(("f",), "label"))
    return shards.Shard.open(path, written)


def batches_of(shard, count, batch, seed=None, shuffle=False, shuffle_buffer=None):
    import tensorflow as tf

    make = shards.dataset_fn(shard, (WIDTH,), batch, seed, shuffle, shuffle_buffer)
    return [(x.numpy(), y.numpy()) for x, y in make(tf.distribute.InputContext()).take(count)]


def in_memory_batches(shard, count, batch):
    """What the reader yielded before it streamed: the whole shard in memory, repeated and batched."""
    import tensorflow as tf

    x, y = (np.concatenate(parts) for parts in zip(*shard.batches(range(shard.record_batches))))
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
    return [(bx.numpy(), by.numpy()) for bx, by in ds.take(count)]


@pytest.fixture
def small_record_batches(monkeypatch):
    """Shards of many record batches (3 rows each), as a large shard has."""
    monkeypatch.setattr(shards, "RECORD_BATCH_BYTES", 3 * WIDTH * 4 + 3 * 8)


def test_unshuffled_stream_yields_the_in_memory_batches_for_an_uneven_pair(tmp_path, small_record_batches):
    big, small = write_shard(tmp_path, "a", 50), write_shard(tmp_path, "b", 23, start=1000)
    assert big.record_batches > 10
    for shard, first in ((big, 0), (small, 1000)):
        streamed, expected = batches_of(shard, 40, batch=8), in_memory_batches(shard, 40, batch=8)
        assert len(streamed) == 40
        for (sx, sy), (ex, ey) in zip(streamed, expected):
            np.testing.assert_array_equal(sx, ex)
            np.testing.assert_array_equal(sy, ey)
        # Partition order, pass after pass, batches straddling the passes' ends.
        in_order = first + np.arange(40 * 8) % shard.rows
        np.testing.assert_array_equal(np.concatenate([y for _, y in streamed]), in_order)


def test_shuffled_stream_sees_every_row_once_per_pass_in_a_fresh_order(tmp_path, small_record_batches):
    shard = write_shard(tmp_path, "a", 60)
    batches = batches_of(shard, 4 * 60 // 5, batch=5, seed=3, shuffle=True, shuffle_buffer=10)
    labels = np.concatenate([y for _, y in batches])
    passes = labels.reshape(4, 60)
    for one_pass in passes:
        assert sorted(one_pass) == list(range(60))
    assert len({tuple(p) for p in passes}) == 4  # a fresh order each pass
    assert list(passes[0]) != list(range(60))
    features = np.concatenate([x for x, _ in batches])
    np.testing.assert_array_equal(features[:, 0], labels)  # rows stay whole


def test_seeded_shuffle_repeats_and_unseeded_does_not(tmp_path, small_record_batches):
    shard = write_shard(tmp_path, "a", 60)
    first, again = (np.concatenate([y for _, y in batches_of(shard, 24, 5, seed=7, shuffle=True)]) for _ in "ab")
    np.testing.assert_array_equal(first, again)
    other = np.concatenate([y for _, y in batches_of(shard, 24, 5, seed=8, shuffle=True)])
    assert list(other) != list(first)


def test_shards_are_written_in_bounded_record_batches(tmp_path, small_record_batches):
    shard = write_shard(tmp_path, "a", 50)
    sizes = [len(x) for x, _ in shard.batches(range(shard.record_batches))]
    assert sum(sizes) == 50 and max(sizes) == 3


def test_default_shuffle_buffer_is_bounded_in_rows_and_bytes(tmp_path):
    shard = write_shard(tmp_path, "a", 50)
    assert shard.shuffle_buffer(None, batch=4) == 50  # a small shard: all of it
    big_rows = shards.Shard(path="", rows=10**6, record_batches=1, width=784, label_dtype=np.float32,
                            bytes_per_row=784 * 4)
    assert big_rows.shuffle_buffer(None, batch=64) == shards.SHUFFLE_BUFFER_ROWS
    big_images = shards.Shard(path="", rows=10**6, record_batches=1, width=None, label_dtype=np.int64,
                              bytes_per_row=100_000)
    assert big_images.shuffle_buffer(None, batch=64) == shards.SHUFFLE_BUFFER_BYTES // 100_000
    assert big_images.shuffle_buffer(5, batch=64) == 64  # at least one batch


def test_seed_zero_with_the_global_seed_set_as_the_workers_set_it(tmp_path, small_record_batches):
    import tensorflow as tf

    shard = write_shard(tmp_path, "a", 60)
    tf.random.set_seed(0)  # what tf_keras.utils.set_random_seed(0) does in a training process
    try:
        labels = np.concatenate([y for _, y in batches_of(shard, 24, 5, seed=0, shuffle=True)])
    finally:
        tf.random.set_seed(None)
    assert sorted(labels[:60]) == list(range(60))


def test_a_validation_shard_takes_only_the_marked_rows_even_when_a_batch_has_none(tmp_path):
    """Spark batches with no validation row (a large partition beside a small validation set) are
    skipped, not written as empty pieces; a worker without validation rows gets an empty shard."""
    batches = [pa.RecordBatch.from_pydict({"f": [[float(v)] * WIDTH for v in range(i, i + 7)],
                                           "label": list(range(i, i + 7)), "held": [i == 14] * 7})
               for i in range(0, 21, 7)]
    layout = ArrayColumn(("f",), "label")
    held = (str(tmp_path / "validation"), lambda batch: batch.column("held"))
    (rows, _), (held_rows, _) = shards.write(batches, str(tmp_path / "training"), layout, held)
    validation = shards.Shard.open(str(tmp_path / "validation"), held_rows)
    assert (rows, held_rows) == (14, 7)
    assert list(np.concatenate([y for _, y in validation.batches(range(validation.record_batches))])) == list(
        range(14, 21))
    (_, _), (none, _) = shards.write(batches[:2], str(tmp_path / "training2"), layout, (str(tmp_path / "v2"),
                                                                                       held[1]))
    assert none == 0 and shards.Shard.open(str(tmp_path / "v2"), 0).record_batches == 0


def test_float_rows_read_a_sliced_batch_as_its_own_rows():
    """A record batch sliced from a larger one (a Parquet source's, a bounded shard's) keeps its rows' offset."""
    from tfbarrier.data.stored_forms import stored_form

    rows = np.arange(5 * WIDTH, dtype=np.float32).reshape(5, WIDTH)
    column = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), WIDTH).slice(2, 2)
    form = stored_form(column.type)
    np.testing.assert_array_equal(form.to_numpy(column), rows[2:4])
    assert form.bytes_of(column) == [rows[2:4].tobytes()]
