"""Time to first step of a fit on one large Parquet file, phase by phase.

400,000 rows x 784 float32 and an int label in one Parquet file (1.25 GB, row groups of 20,000 rows),
read as ``spark.read.parquet(path)``: Spark splits it into about ten partitions, so a 2-worker fit
needs them reshuffled into two. Two contenders, interleaved round by round:

  tasks read the file   the default: each task reads its contiguous share of the rows with pyarrow,
                        checked from the footers (parquet_source.py)
  Spark streams it      spark.tfbarrier.directParquet=false: the driver's aggregate pass over the
                        data, the repartition shuffle, then the JVM's Arrow export to each task

Each fit trains a dense 784-64-10 model for 5 steps; the numbers are ``FitResult.timings``.

    .venv/bin/python bench/first_step_bench.py [--rows 400000] [--rounds 3]
"""

import argparse
import os
import shutil
import statistics
import tempfile

import harness

PHASES = ("prepare", "stage_start", "data_shard", "worker_start", "rendezvous", "strategy_and_model", "first_step")


def fit_timings(spark, path, direct):
    import keras

    import tfbarrier

    spark.conf.set("spark.tfbarrier.directParquet", str(direct).lower())
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    result = tfbarrier.fit(spark.read.parquet(path), model, features="pixels", label="label", batch_size=128,
                           num_workers=2, steps_per_epoch=5, verbose=0)
    return result.timings


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    harness.local_spark_env()

    from feed_bench import ROW_BYTES, write_parquet
    from pyspark.sql import SparkSession

    workdir = tempfile.mkdtemp(prefix="tfbarrier-bench-first-step-")
    path = os.path.join(workdir, "data.parquet")
    write_parquet(path, args.rows, chunk=20_000, keep=False)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    partitions = spark.read.parquet(path).rdd.getNumPartitions()
    contenders = {"tasks read the file (default)": lambda: fit_timings(spark, path, True),
                  "Spark streams it (directParquet=false)": lambda: fit_timings(spark, path, False)}
    for run in contenders.values():  # warm-up: Python workers, spare training processes, page cache
        run()
    log = lambda line: print(line, flush=True)  # noqa: E731
    results = harness.rounds_of({name: (lambda run=run: (harness.settle(), run())[1])
                                 for name, run in contenders.items()}, args.rounds, log)
    spark.stop()
    shutil.rmtree(workdir, ignore_errors=True)

    lines = ["| contender | time to first step: min / median / max s | " + " | ".join(PHASES) + " |",
             "|---|---|" + "---|" * len(PHASES)]
    for name, runs in results.items():
        low, mid, high = harness.stats([t["time_to_first_step"] for t in runs])
        phases = " | ".join(f"{statistics.median(t.get(p, 0.0) for t in runs):.1f}" for p in PHASES)
        lines.append(f"| {name} | {low:.1f} / {mid:.1f} / {high:.1f} | {phases} |")
    body = ("## Time to first step on one large Parquet file\n\n"
            f"`.venv/bin/python bench/first_step_bench.py --rows {args.rows} --rounds {args.rounds}`: "
            f"{args.rows:,} rows x 784 float32 in one Parquet file ({args.rows * ROW_BYTES / 1e9:.2f} GB, "
            f"{partitions} Spark partitions), a 2-worker fit of a dense 784-64-10 model, 5 steps; one warm-up "
            "fit of each contender first. Phases are the medians of `FitResult.timings` (s): prepare (the "
            "driver's checks, the data's profile included), stage_start (submission to the chief's task "
            "starting: Spark's scheduling and any shuffle first), data_shard (the partition to the shard file, "
            "while the training process starts), worker_start, rendezvous, strategy_and_model, first_step. "
            "The phases overlap (data_shard and worker_start run side by side), so they do not add up to "
            "the time to first step.\n\n" + "\n".join(lines))
    harness.write_section("first-step", body)
    print(body)


if __name__ == "__main__":
    main()
