"""A plain Parquet scan is read by the barrier tasks themselves (parquet_source.py): which DataFrames
qualify, the split of rows between workers, and a fit through it that runs no Spark job of its own
besides the barrier stage."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfbarrier
from tfbarrier.data import layouts, parquet_source
from tfbarrier.errors import ColumnError

WIDTH = 64


def write_files(directory, sizes, row_group=40, with_null=False):
    """Parquet files of ``sizes`` rows, numbered consecutively through the files (label = row number)."""
    start = 0
    for n, size in enumerate(sizes):
        labels = np.arange(start, start + size)
        pixels = [[float(v % 17) / 17] * WIDTH for v in labels]
        if with_null:
            pixels[0] = None
        table = pa.table({"pixels": pixels, "label": labels, "other": ["x"] * size})
        pq.write_table(table, f"{directory}/part-{n}.parquet", row_group_size=row_group)
        start += size
    return start


def source_of(df, num_workers=2):
    layout = layouts.layout(df.schema, "pixels", "label")
    frame = df.select(*layout.columns)
    return parquet_source.plan(frame, frame.rdd.getNumPartitions(), layout, num_workers), layout


def test_rows_are_split_evenly_and_exactly_once_across_files_and_row_groups(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_source, "TARGET_BATCH_BYTES", 3000)  # several read batches per row group
    total = write_files(tmp_path, [130, 7, 64])
    source, layout = source_of(spark.read.parquet(str(tmp_path)).coalesce(1), num_workers=3)
    assert source is not None
    assert source.profile["rows"] == total and source.profile["min_length"] == WIDTH
    read = [np.concatenate([b.column("label").to_numpy() for b in parquet_source.read(s, layout.columns)])
            for s in source.slices]
    assert [len(r) for r in read] == [67, 67, 67]
    np.testing.assert_array_equal(np.concatenate(read), np.arange(total))  # contiguous, in order, once each


@pytest.mark.parametrize("change", [
    lambda df: df.filter("label > 3"),
    lambda df: df.withColumn("label", df.label * 2),
    lambda df: df.cache(),
])
def test_anything_but_a_plain_scan_goes_through_spark(spark, tmp_path, change):
    write_files(tmp_path, [50, 50])
    assert source_of(change(spark.read.parquet(str(tmp_path)).coalesce(1)))[0] is None


@pytest.mark.parametrize("to_workers", [lambda df: df.coalesce(2), lambda df: df.repartition(2)])
def test_a_scan_repartitioned_to_num_workers_goes_through_spark(spark, tmp_path, to_workers):
    write_files(tmp_path, [30, 30, 30, 30])
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # no adaptive plan to hide the repartition
    try:
        df = to_workers(spark.read.parquet(str(tmp_path)))
        assert df.rdd.getNumPartitions() == 2 and source_of(df)[0] is None
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")


def test_a_scan_repartitioned_to_another_count_is_read_once_by_the_workers(spark, tmp_path):
    total = write_files(tmp_path, [30, 30, 30, 30])
    source, layout = source_of(spark.read.parquet(str(tmp_path)).repartition(3))
    labels = [label for slices in source.slices for b in parquet_source.read(slices, layout.columns)
              for label in b.column("label").to_pylist()]
    assert labels == list(range(total))


def test_files_whose_types_differ_from_sparks_schema_go_through_spark(spark, tmp_path):
    write_files(tmp_path, [50])
    pq.write_table(pa.table({"pixels": [[0.5] * WIDTH] * 5, "label": pa.array(range(5), pa.int32()),
                             "other": ["y"] * 5}), f"{tmp_path}/part-9.parquet")
    assert source_of(spark.read.parquet(str(tmp_path)).coalesce(1))[0] is None


def test_the_direct_read_can_be_turned_off(spark, tmp_path):
    write_files(tmp_path, [50, 50])
    df = spark.read.parquet(str(tmp_path)).coalesce(1)
    spark.conf.set("spark.tfbarrier.directParquet", "false")
    try:
        assert source_of(df)[0] is None
    finally:
        spark.conf.unset("spark.tfbarrier.directParquet")
    assert source_of(df)[0] is not None


def test_a_scan_with_one_partition_per_worker_is_read_as_spark_partitions_it(spark, tmp_path):
    from pyspark.sql import functions as F

    write_files(tmp_path, [50, 30, 20, 45])
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(2**30))  # whole files, packed by Spark
    try:
        df = spark.read.parquet(str(tmp_path))
        source, layout = source_of(df)
        spark_rows = (df.select("label", F.spark_partition_id().alias("partition")).toPandas()
                      .groupby("partition")["label"].apply(list).to_dict())
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert df.rdd.getNumPartitions() == 2 and source is not None
    for worker, slices in enumerate(source.slices):
        labels = [label for b in parquet_source.read(slices, layout.columns) for label in b.column("label").to_pylist()]
        assert labels == spark_rows[worker]


def test_a_scan_whose_partitions_split_files_goes_through_spark(spark, tmp_path):
    write_files(tmp_path, [400])
    size = (tmp_path / "part-0.parquet").stat().st_size
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(size // 2 + 1))  # the file split in two
    try:
        df = spark.read.parquet(str(tmp_path))
        assert df.rdd.getNumPartitions() == 2 and source_of(df)[0] is None
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")


def test_a_file_split_into_an_empty_partition_trains_through_spark(spark, tmp_path):
    import keras

    write_files(tmp_path, [400], row_group=400)  # one row group: Spark's second split of the file gets no row
    size = (tmp_path / "part-0.parquet").stat().st_size
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(size // 2 + 1))
    try:
        df = spark.read.parquet(str(tmp_path))
        assert sorted(df.rdd.glom().map(len).collect()) == [0, 400]
        model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        result = tfbarrier.fit(df, model, features="pixels", label="label", batch_size=32, verbose=0)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert sorted(w["rows"] for w in result.workers) == [200, 200]


def test_a_spark_partition_of_empty_files_does_not_leave_its_worker_without_rows(spark, tmp_path):
    write_files(tmp_path, [300])
    pq.write_table(pq.read_table(tmp_path / "part-0.parquet").slice(0, 0), tmp_path / "part-1.parquet")  # no rows
    size = (tmp_path / "part-0.parquet").stat().st_size
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(size))  # whole files, one partition each
    try:
        df = spark.read.parquet(str(tmp_path))
        assert sorted(df.rdd.glom().map(len).collect()) == [0, 300]
        source, _ = source_of(df)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert [sum(part.stop - part.start for part in slices) for slices in source.slices] == [150, 150]


def test_nulls_in_the_footers_send_the_data_through_spark_and_its_checks(spark, tmp_path):
    write_files(tmp_path, [50, 50], with_null=True)
    df = spark.read.parquet(str(tmp_path)).coalesce(1)
    assert source_of(df)[0] is None
    with pytest.raises(ColumnError, match="column 'pixels' has 2 null value"):
        tfbarrier.fit(df, lambda: None, features="pixels", label="label")


def jobs_outside_groups(spark):
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


def test_fit_on_a_plain_scan_reads_it_in_the_tasks_with_no_other_spark_job(spark, tmp_path):
    import keras

    total = write_files(tmp_path, [300, 211], row_group=64)
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    plain = spark.read.parquet(str(tmp_path)).coalesce(1)

    before = jobs_outside_groups(spark)
    result = tfbarrier.fit(plain, model, features="pixels", label="label", batch_size=32, verbose=0)
    assert jobs_outside_groups(spark) == before  # no profile pass, no repartition: only the barrier stage
    assert [w["rows"] for w in result.workers] == [256, 255]
    assert result.workers[0]["shard_checksum"] != result.workers[1]["shard_checksum"]
    assert result.timings["prepare"] >= 0 and result.timings["stage_start"] >= 0

    filtered = plain.filter(f"label < {total}")  # the same rows, but not a plain scan
    tfbarrier.fit(filtered, model, features="pixels", label="label", batch_size=32, verbose=0)
    assert jobs_outside_groups(spark) > before  # the profile pass: the check above can fail
