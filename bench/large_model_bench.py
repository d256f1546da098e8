"""Large models (issues 29 and 43): MLPs of 61, 250, 300 and 340 M parameters (input 1024, two hidden
layers, 10 outputs; 244 MB to 1.4 GB of float32 weights) trained by tfbarrier.fit with 2 workers on
local[2], with Spark's default driver and executor memory (1 GB heaps), side by side with the floor,
round by round. mlp340-sgd and mlp250-adam are about the largest that this 24 GiB machine trains with
SGD and Adam (the driver on the same machine): a 400 M model with SGD, which the check passed before it
kept a tenth of the machine free, was ended by the OOM killer.

  floor         one plain tf_keras process that loads the model from a local .keras file and takes
                one step (global batch 64): time from its start to the step's end
  fit, cold     tfbarrier.fit in a driver process of its own (a fresh SparkSession, so the training
                processes import TensorFlow), 256 rows, global batch 64, 4 steps
  fit, warm     a second fit in the same driver (spare training processes)
  Spark's share what Spark itself takes of a cold fit (spark_share.py), once per round: a cold fit's
                floor is the floor plus this

Per fit it records: time to first step (from the call), how fast the model's files reached the
workers (MB/s, fetch) and the trained weights reached the driver; peak resident memory of each
training process against its TensorFlow baseline (before the model) and of the driver against its
own before the call (both sampled every 50 ms); the JVM heap's use before and at its peak during the
fit (the heap pools' peak usage, reset before the call); and checks that the fit trained (weights
changed), that the workers ended equal, that predict() scores and FitResult.save() writes; and what
the memory check gave each worker when fit was called, with the largest model it would accept then.
``--checkpoint`` measures instead (a section of its own) the cost of fit(checkpoint_every=) on the
61 M model: 16 steps with and without a save every 4 steps, interleaved, the seconds each save holds
the step loop, and the floor's: one process writing the same weights with tf.train.Checkpoint.

    .venv/bin/python bench/large_model_bench.py [--rounds 3] [--models mlp61-sgd mlp61-adam ...]
    .venv/bin/python bench/large_model_bench.py --checkpoint [--rounds 3]
"""

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import harness  # noqa: E402
from large_model_runs import BATCH, fmt, keras_files, run_driver, run_floor, run_spark_share  # noqa: E402
from memory_probes import PeakSampler, jvm_heap, process_mb, resident_mb  # noqa: E402

harness.local_spark_env()

INPUT, OUTPUTS, ROWS = 1024, 10, 256
# hidden width, optimizer. The last two: the largest that 2 workers train on this 24 GiB machine (issue 43)
MODELS = {"mlp61-sgd": (7310, "sgd"), "mlp61-adam": (7310, "adam"), "mlp300-sgd": (16810, "sgd"),
          "mlp340-sgd": (17930, "sgd"), "mlp250-adam": (15300, "adam")}


def build(keras, name):
    hidden, optimizer = MODELS[name]
    layers = keras.layers
    model = keras.Sequential([keras.Input((INPUT,)), layers.Dense(hidden, activation="relu"),
                              layers.Dense(hidden, activation="relu"), layers.Dense(OUTPUTS)])
    model.compile(optimizer=keras.optimizers.SGD(0.01) if optimizer == "sgd" else keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(rows=ROWS):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.random((rows, INPUT), dtype=np.float32), rng.integers(0, OUTPUTS, rows)


# ---- the floor: python large_model_bench.py floor --model M --file F.keras --clock C ------------------

def floor(args):
    started = float(args.started)
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow  # noqa: F401
    import tf_keras

    tensorflow_mb = resident_mb()[0]
    model = tf_keras.models.load_model(args.file)
    x, y = data(BATCH)
    model.train_on_batch(x, y)
    first_step = time.time()
    for _ in range(3):  # the peak of a few steps, as the fits take 4
        model.train_on_batch(x, y)
    growth_mb = resident_mb()[1] - tensorflow_mb
    with tempfile.TemporaryDirectory(prefix="large-bench-write-") as directory:  # what writing the bytes takes
        checkpoint = tensorflow.train.Checkpoint(model=model)
        checkpoint.write(os.path.join(directory, "warm-up"))
        written = time.perf_counter()
        checkpoint.write(os.path.join(directory, "timed"))
        write_seconds = time.perf_counter() - written
    with open(args.clock, "w") as f:
        json.dump({"first_step": first_step - started, "growth_mb": growth_mb, "write_seconds": write_seconds}, f)
    os._exit(0)


# ---- tfbarrier: python large_model_bench.py driver --model M --out O [--checkpoint-every N] -----------

def driver(args):
    import keras
    import psutil

    import tfbarrier

    spark, df = driver_session()
    model = build(keras, args.model)
    weights_before = weights_digest(model)
    jvm = next(c for c in psutil.Process().children(recursive=True) if "java" in c.name())
    read_heap, reset_heap = jvm_heap(spark)
    report = {"model": args.model, "parameters": int(model.count_params()),
              "weights_mb": sum(w.numpy().nbytes for w in model.weights) / 2**20, "fits": []}
    fit_args = dict(features="x", label="y", batch_size=BATCH, num_workers=2, verbose=0)
    if args.checkpoint_every is not None:  # 0: checkpoint_dir alone (a save at the epoch's end)
        fit_args.update(steps_per_epoch=args.steps, checkpoint_dir=harness.scratch_dir(prefix="large-bench-ckpt-"),
                        checkpoint_every=args.checkpoint_every or None)
    elif args.steps:
        fit_args.update(steps_per_epoch=args.steps)
    for _ in range(args.fits):
        reset_heap()
        if refused(report, spark, model):
            break
        heap_before, _ = read_heap()
        driver_before = psutil.Process().memory_info().rss / 2**20
        jvm_before = jvm.memory_info().rss / 2**20
        with PeakSampler(process_mb(os.getpid()), 0.05) as driver_peak, \
                PeakSampler(process_mb(jvm.pid), 0.05) as jvm_peak:
            started = time.time()
            result = tfbarrier.fit(df, model, **fit_args)
            seconds = time.time() - started
        _, heap_peak = read_heap()
        memory = {"driver_before_mb": driver_before, "driver_peak_mb": driver_peak.peak_mb,
                  "jvm_rss_before_mb": jvm_before, "jvm_rss_peak_mb": jvm_peak.peak_mb,
                  "heap_before_mb": heap_before, "heap_peak_mb": heap_peak}
        report["fits"].append(fit_record(result, seconds, memory, weights_before))
    if not report.get("refused"):
        check_trained(report, df, result)
    with open(args.out, "w") as f:
        json.dump(report, f)
    spark.stop()


def driver_session():
    """The driver's SparkSession on local[2] and its cached DataFrame of the ROWS rows, in 2 partitions."""
    import pandas as pd
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("large-model-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    x, y = data()
    df = spark.createDataFrame(pd.DataFrame({"x": list(x), "y": y})).repartition(2).cache()
    df.count()
    return spark, df


def weights_digest(model):
    """A digest of the first two weights (the first layer's), to tell whether training changed them."""
    return hashlib.sha256(b"".join(w.numpy().tobytes() for w in model.weights[:2])).hexdigest()


def fit_record(result, seconds, memory, weights_before):
    """What the report keeps of a fit: timings, transfer rates, memory, and whether it trained."""
    chief = result.workers[0]
    return {
        "time_to_first_step": result.timings["time_to_first_step"], "total": seconds,
        "timings": result.timings, "worker_timings": [w["timings"] for w in result.workers],
        "training": result.timings["training"], "steps": chief["steps"],
        "fetch_mb_s": [w["transfer"]["fetched_bytes"] / 2**20 / max(w["transfer"]["fetch_seconds"], 1e-9)
                       for w in result.workers],
        "fetch_seconds": [w["transfer"]["fetch_seconds"] for w in result.workers],
        "send_mb_s": chief["transfer"]["sent_bytes"] / 2**20 / max(chief["transfer"]["send_seconds"], 1e-9),
        "via": chief["transfer"]["via"], "warm": [w["warm_start"] for w in result.workers],
        "workers_memory": [w["memory"] for w in result.workers],
        **memory,
        "equal_workers": len({w["checksum"] for w in result.workers}) == 1,
        "weights_changed": weights_digest(result.model) != weights_before,
        "saves": chief["checkpoint_saves"], "save_seconds": chief["timings"].get("checkpoints"),
    }


def check_trained(report, df, result):
    """That predict() scores with the last fit's result and FitResult.save() writes it, in ``report``."""
    import tfbarrier

    scored = tfbarrier.predict(df.limit(16), result, features="x").toPandas()
    report["predicted_rows"] = int(scored["prediction"].notna().sum())
    with tempfile.TemporaryDirectory() as tmp:
        report["saved_mb"] = os.path.getsize(result.save(os.path.join(tmp, "m.keras"))) / 2**20


def refused(report, spark, model):
    """Whether fit's check on the driver refuses the model (its workers cannot hold it): then its
    message is in ``report`` (fit would raise it before the stage)."""
    from tfbarrier.errors import ModelError
    from tfbarrier.models import memory
    from tfbarrier.spark.worker_memory import executor_budget

    report["worker_budget"] = executor_budget(spark, 2)[0]  # what the check gives each worker now
    try:
        memory.check_on_driver(spark, memory.ModelSize.of(model), BATCH // 2, 2)
    except ModelError as exc:
        report["refused"] = str(exc)
        return True
    return False


# ---- the benchmark --------------------------------------------------------------------------------

def save(args):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tf_keras

    build(tf_keras, args.model).save(args.file)


def model_rows(name, floors, drivers):
    first = drivers[0]
    weights = first["weights_mb"]
    if first.get("refused"):
        return [f"| {name} | {first['parameters'] / 1e6:.0f} M, {weights:,.0f} MB | refused before the stage "
                f"(floor: first step {fmt([f['first_step'] for f in floors])} s, "
                f"{fmt([f['growth_mb'] for f in floors], 0)} MB above its TensorFlow baseline): "
                f"{first['refused']} |||||||||||"]
    size = weights * (4 if MODELS[name][1] == "adam" else 2)  # weights, gradients and Adam's two slots
    floor_first = [f["first_step"] for f in floors]
    # a cold fit pays Spark's first jobs too (a warm one finds Spark's Python workers started)
    cold_floor = [f["first_step"] + f["spark"]["profile"] + f["spark"]["python_tasks"] for f in floors]
    rows = []
    for number, label in enumerate(("cold", "warm")):
        fits = [d["fits"][number] for d in drivers]
        first_step = [f["time_to_first_step"] for f in fits]
        ratio = statistics.median(first_step) / statistics.median(floor_first)
        with_spark = (f"{fmt(cold_floor)} s | {statistics.median(first_step) / statistics.median(cold_floor):.2f}"
                      if label == "cold" else "- | -")
        growth = [max(m["peak_mb"] - m["tensorflow_mb"] for m in f["workers_memory"]) for f in fits]
        driver_growth = [f["driver_peak_mb"] - f["driver_before_mb"] for f in fits]
        heap_growth = [f["heap_peak_mb"] - f["heap_before_mb"] for f in fits]
        rows.append(
            f"| {name}, {label} | {first['parameters'] / 1e6:.0f} M, {weights:,.0f} MB | {fmt(first_step)} s | "
            f"{fmt(floor_first)} s | {ratio:.2f} | {with_spark} | {fmt([min(f['fetch_mb_s']) for f in fits], 0)} | "
            f"{fmt([f['send_mb_s'] for f in fits], 0)} | {fmt(growth, 0)} (limit {1.25 * size:,.0f}; floor "
            f"{fmt([f['growth_mb'] for f in floors], 0)}) | "
            f"{fmt(driver_growth, 0)} (limit {2 * weights:,.0f}) | {fmt(heap_growth, 0)} | "
            f"{all(f['weights_changed'] and f['equal_workers'] for f in fits)} |")
    return rows


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", nargs="?", default="bench", choices=("bench", "floor", "driver", "save"))
    parser.add_argument("--model")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--file")
    parser.add_argument("--clock")
    parser.add_argument("--started")
    parser.add_argument("--out")
    parser.add_argument("--fits", type=int, default=2)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--checkpoint-every", type=int)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoint", action="store_true")
    return parser.parse_args()


def main():
    args = parse_args()
    if args.kind == "floor":
        return floor(args)
    if args.kind == "driver":
        return driver(args)
    if args.kind == "save":
        return save(args)
    if args.checkpoint:
        from large_model_checkpoint import checkpoint_section

        return harness.write_section("large-models-checkpoint", checkpoint_section(args.rounds))
    floors, drivers = measure_rounds(args.models, args.rounds)
    harness.write_section("large-models", large_models_section(args.models, args.rounds, floors, drivers))


def measure_rounds(models, rounds):
    """Each model's floor and driver (two fits), in turn, ``rounds`` times: (name -> floors, name -> drivers)."""
    with tempfile.TemporaryDirectory(prefix="large-bench-") as directory:
        files = keras_files(models, directory)
        floors, drivers = {n: [] for n in models}, {n: [] for n in models}
        for number in range(rounds):
            harness.settle()
            spark_share = run_spark_share()
            print(f"round {number + 1} Spark's share of a cold fit: {spark_share}", flush=True)
            for name in models:
                harness.settle()
                floors[name].append({**run_floor(name, files[name]), "spark": spark_share})
                harness.settle()
                drivers[name].append(run_driver(name))
                print(f"round {number + 1} {name}: floor {floors[name][-1]}, fit "
                      f"{[f['time_to_first_step'] for f in drivers[name][-1]['fits']]}", flush=True)
    return floors, drivers


def large_models_section(models, rounds, floors, drivers):
    lines = [
        "`.venv/bin/python bench/large_model_bench.py --rounds " + str(rounds) + "`: 2 workers on local[2], "
        "Spark's default memory (1 GB heaps), 256 rows of 1024 float32, global batch 64, 4 steps; median "
        "(min-max) of the rounds. Memory: a training process's peak resident memory above its TensorFlow "
        "baseline (before the model), against 1.25 x (weights + optimizer slots + gradients) and against the "
        "floor's own growth over 4 steps (one process, no strategy); the driver's "
        "peak during the fit above its memory before the call, against 2 x weights; the JVM heap's peak use "
        "during the fit above its use before it. Spark's share of a cold fit (a fresh SparkSession, the same "
        "cached data, no model): its data check's aggregate job, then a barrier job of 2 Arrow tasks that import "
        "tfbarrier's task module, once per round.",
        "",
        "| model | parameters, weights | time to first step | floor | ratio | floor + Spark's share | ratio | "
        "fetch MB/s (slowest worker) | trained weights back MB/s | training process growth MB | driver growth MB | "
        "JVM heap growth MB | trained, replicas equal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in models:
        lines += model_rows(name, floors[name], drivers[name])
    checks = [(name, d["predicted_rows"], d["saved_mb"]) for name in models for d in drivers[name][:1]
              if not d.get("refused")]
    lines += ["", "predict() and save() after each model's fits: " + "; ".join(
        f"{name}: {rows} rows scored, a {mb:,.0f} MB .keras archive" for name, rows, mb in checks) + "."]
    lines += ["", "The memory check, with what this machine had available when each driver called fit (its model "
              "built), gave each worker: " + "; ".join(check_limit(name, drivers[name]) for name in models) + "."]
    return "\n".join(lines)


def check_limit(name, drivers):
    """What the memory check gave each worker of ``name``'s fits, and the parameters (float32) of the largest
    model of its optimizer that it would then accept (its batch and layer outputs, a few MB here, left out)."""
    from tfbarrier.models import memory

    budget, optimizer = statistics.median(d["worker_budget"] for d in drivers), MODELS[name][1]
    # a MiB of float32 weights, as one matrix (these MLPs are mostly one), over the ring (the default)
    a_mib = memory.ModelSize(weights=2**20, trainable=2**20, slots=2 if optimizer == "adam" else 0, optimizer="")
    largest = (budget - memory.TENSORFLOW_BYTES) / (4 * (a_mib.worker_bytes(0) - memory.TENSORFLOW_BYTES) / 2**20)
    return (f"{name} {budget / 2**30:.1f} GiB (the largest {optimizer.upper()} model it accepts then: "
            f"{largest / 1e6:,.0f} M parameters)")


if __name__ == "__main__":
    main()
