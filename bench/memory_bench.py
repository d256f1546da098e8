"""Peak resident memory of a training process against the size of its shard.

A real 2-worker ``tfbarrier.fit`` (a small dense model, one pass over every row, global batch 1024)
on rows x 784 float32 from Parquet (row groups of 20,000 rows; Spark's driver JVM gets 4 GB): one
file per worker, each read as one partition, so each worker's shard is that file's rows and the
DataFrame needs no repartition. Every training process reports
its own resident memory once TensorFlow, the strategy and the model are set up (baseline) and its
peak (``ru_maxrss``) at the end (``FitResult.workers[i]["memory"]``). Also sampled from outside every
0.2 s (``psutil``), which is how the path before streaming (``--baseline-ref``, a git revision run
from a worktree in build/, which reports no memory of its own) is measured.

Each size runs in a process of its own (a fresh Spark): ``--one SIZE_GB`` is that process's command
line.

    .venv/bin/python bench/memory_bench.py [--gb 0.3 1 3] [--baseline-ref 74a8fa1 --baseline-gb 0.3]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import harness
from memory_probes import PeakSampler, training_processes_mb

BENCH = os.path.dirname(os.path.abspath(__file__))
WIDTH, BATCH, BOUND_MB = 784, 1024, 512
ROW_BYTES = WIDTH * 4 + 8


def one(size_gb):
    """One fit on two shards of ``size_gb`` each; prints a RESULT line."""
    import keras
    from feed_bench import write_parquet
    from pyspark.sql import SparkSession

    import tfbarrier

    rows = int(size_gb * 1e9 / ROW_BYTES)
    data = tempfile.mkdtemp(prefix="tfbarrier-bench-memory-")
    try:
        for worker in range(2):
            write_parquet(os.path.join(data, f"part-{worker}.parquet"), rows, chunk=20_000, seed=worker, keep=False)
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "4g")
                 .config("spark.sql.files.maxPartitionBytes", str(2 * rows * ROW_BYTES)).getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        df = spark.read.parquet(data)
        assert df.rdd.getNumPartitions() == 2, df.rdd.getNumPartitions()
        model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        sampler = PeakSampler(training_processes_mb, 0.2).start()
        result = tfbarrier.fit(df, model, features="pixels", label="label", batch_size=BATCH, num_workers=2,
                               verbose=0)
        sampled = sampler.stop()
        spark.stop()
    finally:
        shutil.rmtree(data, ignore_errors=True)
    workers = [{"rows": w["rows"], **w.get("memory", {})} for w in result.workers]
    print("RESULT " + json.dumps({"workers": workers, "sampled_peak_mb": sampled, "timings": result.timings}),
          flush=True)


def measure(size_gb, source=None):
    """Run ``one`` in a process of its own (``source``: tfbarrier's sources to import instead)."""
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, BENCH, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, __file__, "--one", str(size_gb)], capture_output=True, text=True,
                         env=env, cwd=BENCH)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[0][len("RESULT "):])


def row(label, size_gb, result):
    if "error" in result:
        return f"| {label} | {size_gb} | - | - | - | - | failed: {result['error'][:120]} |"
    memory = [w for w in result["workers"] if "peak_mb" in w]
    if memory:
        baseline = max(w["baseline_mb"] for w in memory)
        peak = max(w["peak_mb"] for w in memory)
        growth = max(w["peak_mb"] - w["baseline_mb"] for w in memory)
        verdict = "yes" if growth <= BOUND_MB else "no"
        cells = f"{baseline:,.0f} | {peak:,.0f} | {growth:+,.0f} | {verdict}"
    else:
        cells = "- | - | - | -"
    ttfs = result["timings"].get("time_to_first_step", float("nan"))
    return (f"| {label} | {size_gb} | {cells} | sampled peak {result['sampled_peak_mb']:,.0f} MB; "
            f"rows per shard {result['workers'][0]['rows']:,}; time to first step {ttfs:.1f} s |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, nargs="+", default=[0.3, 1, 3], help="shard sizes, GB")
    parser.add_argument("--baseline-ref", help="also run this git revision (the path before streaming)")
    parser.add_argument("--baseline-gb", type=float, nargs="+", default=[0.3])
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    harness.local_spark_env()
    if args.one is not None:
        return one(args.one)


    lines = ["| path | shard GB | baseline MB | peak MB | peak - baseline MB | within +512 MB? | notes |",
             "|---|---|---|---|---|---|---|"]
    for size_gb in args.gb:
        lines.append(row("streaming (this tree)", size_gb, measure(size_gb)))
        print(lines[-1], flush=True)
    if args.baseline_ref:
        source = harness.worktree(args.baseline_ref)
        for size_gb in args.baseline_gb:
            lines.append(row(f"in memory ({args.baseline_ref})", size_gb, measure(size_gb, source)))
            print(lines[-1], flush=True)
    command = "`.venv/bin/python bench/memory_bench.py --gb " + " ".join(f"{g:g}" for g in args.gb)
    if args.baseline_ref:
        command += f" --baseline-ref {args.baseline_ref} --baseline-gb " + " ".join(f"{g:g}" for g in args.baseline_gb)
    body = ("## Memory of a training process against its shard\n\n" + command + "`: a 2-worker fit, one pass "
            f"over every row at global batch {BATCH}, of a dense 784-64-10 model on rows x 784 float32 "
            "from Parquet (one file, one partition, per worker). Baseline: the training process's resident "
            "memory once TensorFlow, the strategy and the model are set up; peak: its `ru_maxrss` at the "
            "end; the larger of the two workers. The target: peak at most baseline + 512 MB.\n\n"
            + "\n".join(lines))
    harness.write_section("memory", body)
    print(body)


if __name__ == "__main__":
    main()
