"""Data feed: rows/s and MB/s from a Spark DataFrame partition to batches of a tf.data pipeline, by
tfbarrier's path (the task streams the partition's Arrow batches into a shard file, the training
process streams it back record batch by record batch) against toPandas() + from_tensor_slices on the
driver, against the path of a plain Parquet scan (the task reads the file with pyarrow itself), and
against the same rows already in memory as a NumPy array (the limit). One partition, one
process each; batches of 64 (no shuffle) drained in graph mode, as Keras drains them: tfbarrier's
streaming pipeline for the shard, from_tensor_slices for arrays in memory. The DataFrame is read from
a Parquet file (rows x 784 float32 + a label). One more line times Spark's part alone (the
partition's Arrow batches reaching the Python worker, then dropped).

    .venv/bin/python bench/feed_bench.py [--rows 100000 1000000] [--rounds 3]
"""

import argparse
import os
import shutil
import sys
import tempfile

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import harness  # noqa: E402

WIDTH, BATCH = 784, 64
ROW_BYTES = WIDTH * 4


def write_parquet(path, rows, chunk=100_000, seed=0, keep=True):
    """rows x 784 random float32 (a list column, as Spark writes arrays) and an int label, written in
    chunks; returns the same rows as NumPy arrays (x, y), or None unless ``keep``."""
    rng = np.random.default_rng(seed)
    kept = []
    schema = pa.schema([("pixels", pa.list_(pa.float32())), ("label", pa.int64())])
    with pq.ParquetWriter(path, schema, compression="none") as writer:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            x, y = rng.random((n, WIDTH), dtype=np.float32), rng.integers(0, 10, n)
            if keep:
                kept.append((x, y))
            offsets = pa.array(np.arange(0, (n + 1) * WIDTH, WIDTH, dtype=np.int32))
            pixels = pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)))
            writer.write_table(pa.table({"pixels": pixels, "label": pa.array(y)}, schema=schema))
    return tuple(np.concatenate(parts) for parts in zip(*kept)) if keep else None


def count_batches(ds, rows):
    """Drain every full batch of ``ds`` over ``rows`` rows in graph mode, as Keras does; returns batches."""
    return int(ds.take(rows // BATCH).reduce(np.int64(0), lambda count, _: count + 1))


def drain_shard(shard):
    """tfbarrier's streaming pipeline (shards.dataset_fn, no shuffle) over a shard file."""
    import tensorflow as tf

    from tfbarrier.data import shards

    make = shards.dataset_fn(shard, (WIDTH,), BATCH, seed=0, shuffle=False)
    return count_batches(make(tf.distribute.InputContext()), shard.rows)


def drain_arrays(x, y):
    """The same batches from arrays already in memory (from_tensor_slices)."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH, drop_remainder=True)
    return count_batches(ds.prefetch(tf.data.AUTOTUNE), len(x))


def shard_path(df, layout):
    """tfbarrier's feed, in one Spark task: partition -> Arrow shard file -> mmap -> tf.data."""

    def feed(batches):
        from tfbarrier.data import shards

        workdir = tempfile.mkdtemp(prefix="tfbarrier-bench-shard-")
        try:
            path = os.path.join(workdir, "shard.arrow")
            rows, _ = shards.write(batches, path, layout)
            drained = drain_shard(shards.Shard.open(path, rows))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        yield pa.RecordBatch.from_pydict({"rows": [rows], "batches": [drained]})

    def run():
        result = df.mapInArrow(feed, "rows long, batches long").collect()[0]
        return result["rows"]
    return run


def direct_path(spark, path, layout):
    """tfbarrier's feed for a plain Parquet scan, in one Spark task: the file's rows read by the task
    with pyarrow (parquet_source.py) -> Arrow shard file -> streamed into tf.data."""

    def feed(_):
        from tfbarrier.data import parquet_source, shards

        workdir = tempfile.mkdtemp(prefix="tfbarrier-bench-direct-")
        try:
            shard = os.path.join(workdir, "shard.arrow")
            whole_file = [parquet_source.Slice(path, 0, pq.read_metadata(path).num_rows)]
            rows, _ = shards.write(parquet_source.read(whole_file, layout.columns), shard, layout)
            drained = drain_shard(shards.Shard.open(shard, rows))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        yield pa.RecordBatch.from_pydict({"rows": [rows], "batches": [drained]})

    def run():
        return spark.range(0, 1, numPartitions=1).mapInArrow(feed, "rows long, batches long").collect()[0]["rows"]
    return run


def spark_to_python(df):
    """Only the part Spark does: the partition's Arrow batches arrive in the Python worker, and are dropped."""

    def count(batches):
        yield pa.RecordBatch.from_pydict({"rows": [sum(len(batch) for batch in batches)]})

    def run():
        return df.mapInArrow(count, "rows long").collect()[0]["rows"]
    return run


def to_pandas_path(df):
    def run():
        frame = df.toPandas()
        x = np.stack(frame["pixels"].to_numpy()).astype(np.float32, copy=False)
        y = frame["label"].to_numpy()
        del frame  # at 1e6 rows the frame, the stacked copy and TensorFlow's copy would not fit together
        drain_arrays(x, y)
        return len(x)
    return run


def in_memory(x, y):
    def run():
        drain_arrays(x, y)
        return len(x)
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--to-pandas-max-rows", type=int, default=100_000,
                        help="leave toPandas() out above this: the whole partition lands on the driver")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from tfbarrier.data import layouts

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "6g")
             .config("spark.driver.maxResultSize", "0")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    sections = []
    for rows in args.rows:
        workdir = tempfile.mkdtemp(prefix="tfbarrier-bench-feed-")
        path = os.path.join(workdir, "data.parquet")
        x, y = write_parquet(path, rows)
        df = spark.read.parquet(path).coalesce(1)
        layout = layouts.layout(df.schema, "pixels", "label")
        contenders = {
            "tfbarrier shard (Spark partition -> Arrow file -> streamed)": shard_path(df, layout),
            "tfbarrier direct read (pyarrow in the task -> Arrow file -> streamed)": direct_path(spark, path, layout),
            "Spark partition -> Python worker only": spark_to_python(df),
            "toPandas() + from_tensor_slices": to_pandas_path(df),
            "NumPy array in memory (limit)": in_memory(x, y),
        }
        if rows > args.to_pandas_max_rows:
            del contenders["toPandas() + from_tensor_slices"]
        for run in contenders.values():  # warm-up: Python worker, TensorFlow import, page cache
            run()
        rates = harness.interleaved(contenders, args.rounds)
        mb = {name: [r * ROW_BYTES / 1e6 for r in series] for name, series in rates.items()}
        sections.append(f"{rows:,} rows x {WIDTH} float32 ({rows * ROW_BYTES / 1e9:.2f} GB):\n\n"
                        + harness.table(rates, "rows/s", "NumPy array in memory (limit)")
                        + "\n\n" + harness.table(mb, "MB/s", "NumPy array in memory (limit)"))
        del x, y
        shutil.rmtree(workdir, ignore_errors=True)
        body = ("## Data feed\n\n"
                f"`.venv/bin/python bench/feed_bench.py --rows {' '.join(map(str, args.rows))} --rounds {args.rounds}`: "
                "one partition of a Parquet-backed DataFrame to drained batches of 64 (tfbarrier's tf.data "
                "pipeline, graph mode), end to end from the driver's call; one warm-up run of each first.\n\n"
                + "\n\n".join(sections))
        harness.write_section("feed", body)  # after each size: a later one may not fit in memory
        print(body, flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
