"""A training process streams its shard: a 640 MB shard, more than the allowance, does not push it
past its memory after setting up TensorFlow and the model plus 512 MB (a reader that held the shard
once would). bench/memory_bench.py measures 0.3, 1 and 3 GB."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tfbarrier

WIDTH = 784
ROWS_PER_SHARD = 640 * 2**20 // (WIDTH * 4)


def write_parquet(path, rows, seed):
    rng = np.random.default_rng(seed)
    with pq.ParquetWriter(path, pa.schema([("pixels", pa.list_(pa.float32())), ("label", pa.int64())])) as writer:
        for start in range(0, rows, 20_000):
            n = min(20_000, rows - start)
            offsets = pa.array(np.arange(0, (n + 1) * WIDTH, WIDTH, dtype=np.int32))
            pixels = pa.ListArray.from_arrays(offsets, pa.array(rng.random(n * WIDTH, dtype=np.float32)))
            writer.write_table(pa.table({"pixels": pixels, "label": rng.integers(0, 10, n)}))


def test_a_640_mb_shard_stays_within_baseline_plus_512_mb(spark, tmp_path):
    import keras

    for worker in range(2):
        write_parquet(os.path.join(tmp_path, f"part-{worker}.parquet"), ROWS_PER_SHARD, seed=worker)
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(2**30))  # one file, one partition, one shard
    try:
        df = spark.read.parquet(str(tmp_path))
        assert df.rdd.getNumPartitions() == 2
        model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(10)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        result = tfbarrier.fit(df, model, features="pixels", label="label", batch_size=1024, num_workers=2,
                               verbose=0)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    for worker in result.workers:
        assert worker["rows"] == ROWS_PER_SHARD
        memory = worker["memory"]
        assert 0 < memory["baseline_mb"] <= memory["peak_mb"] <= memory["baseline_mb"] + 512, memory
