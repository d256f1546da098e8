"""Rows/s and memory of distributed scoring, side by side in one run: tfbarrier.predict on local[2]
(class probabilities, and output="features") against model.predict in one plain process scoring the same
rows and pyspark's predict_batch_udf (for the CNN), same batch size, interleaved round by round; and the floor:
the same rows through tfbarrier.predict's own UDF, read into numpy as predict reads them, zeros returned as
scores, no model (what moving the rows through Spark costs on these cores). Two models: the
slides' CNN on 28x28 images, and a 61 M-parameter MLP (1024 inputs, two hidden layers of 7,310 units:
the large model of bench/memory_estimate_bench.py).

Memory: the peak resident memory of the executors' Python workers while a contender scores (the largest
one, sampled every 50 ms; a worker keeps the models it scored, two at most), and the one process's
``ru_maxrss`` (it holds its rows too). The one process runs in a process of its own, the model loaded and
every row scored once before the clock starts, as the Spark contenders' warm-up run does for their workers
(the one process of the 61 M model is bimodal all the same: 970 or 1,620 rows/s from one process to the next, also with one intra-op thread, 490 or 850).

    .venv/bin/python bench/predict_bench.py [--rows 50000] [--large-rows 5000] [--rounds 3]

With TF_ENABLE_ONEDNN_OPTS=0 (for every process it starts) it writes a section of its own.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

import harness  # noqa: E402

HIDDEN_61M = 7310
SHAPES = {"cnn": (28, 28, 1), "mlp61": (1024,)}


def build(name):
    import keras

    if name == "cnn":
        from mnist_demo import slides_cnn

        return slides_cnn()
    layers = keras.layers
    return keras.Sequential([keras.Input(SHAPES[name]), layers.Dense(HIDDEN_61M, activation="relu"),
                             layers.Dense(HIDDEN_61M, activation="relu"), layers.Dense(10, activation="softmax")])


def rows_of(name, count):
    return np.random.default_rng(0).random((count, int(np.prod(SHAPES[name]))), dtype=np.float32)


def one_process(path, name, count, batch_size):
    """The ``--one-process`` run: load, score every row once (as the Spark contenders' warm-up run does: each
    batch shape is traced then), then time scoring them again; prints JSON."""
    import keras

    model = keras.models.load_model(path)
    x = rows_of(name, count).reshape((count, *SHAPES[name]))
    model.predict(x, batch_size=batch_size, verbose=0)
    started = time.perf_counter()
    model.predict(x, batch_size=batch_size, verbose=0)
    seconds = time.perf_counter() - started
    print(json.dumps({"rows_per_s": count / seconds,
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


class PythonWorkersPeak:
    """The largest resident memory of any Spark Python worker (``pyspark.daemon`` and its forks) while inside."""

    def __enter__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.05):
            for process in psutil.process_iter(["cmdline", "memory_info"]):
                if "pyspark.daemon" in " ".join(process.info["cmdline"] or ()) and process.info["memory_info"]:
                    self.peak = max(self.peak, process.info["memory_info"].rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def spark_contenders(spark, name, model, path, count, batch_size):
    import pandas as pd

    import tfbarrier

    df = spark.createDataFrame(pd.DataFrame({"x": list(rows_of(name, count))})).repartition(2).cache()
    df.count()

    def scored(frame):
        with PythonWorkersPeak() as memory:
            started = time.perf_counter()
            frame.write.format("noop").mode("overwrite").save()
            seconds = time.perf_counter() - started
        return {"rows_per_s": count / seconds, "peak_mb": memory.peak / 2**20}

    runs = {f"{name}: tfbarrier.predict (local[2])": lambda: scored(
                tfbarrier.predict(df, model, features="x", output="probabilities", batch_size=batch_size)),
            f"{name}: tfbarrier.predict, output=\"features\" (local[2])": lambda: scored(
                tfbarrier.predict(df, model, features="x", output="features", batch_size=batch_size))}
    if name == "cnn":
        runs[f"{name}: predict_batch_udf (local[2])"] = lambda: scored(
            df.withColumn("prediction", _peer(path, name, batch_size)("x")))
    runs[f"{name}: floor, tfbarrier.predict without the model (local[2])"] = lambda: scored(floor(df, 10))
    return runs


def floor(df, units):
    """``df`` through tfbarrier.predict's own UDF, its rows read into numpy as predict reads them and ``units``
    zeros a row returned as predict returns scores, the model left out: what moving the rows costs."""
    from pyspark.sql import functions as F

    from tfbarrier.predicting import inference
    from tfbarrier.data.layouts import layout as features_layout
    from tfbarrier.data.stored_forms import stored_form

    layout = features_layout(df.schema, "x", scoring=True)

    def score(batches):
        for batch in batches:
            x = layout.x(batch)
            rows = stored_form(x.type).to_numpy(x)
            yield inference.output_column(np.zeros((len(rows), units), np.float32), "probabilities")

    udf = inference.scoring_udf(score, "array<float>")
    return df.withColumn("prediction", udf(F.struct(*layout.feature_projection(df.sparkSession))))


def _peer(path, name, batch_size):
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    shape = SHAPES[name]

    def make_predict_fn():
        import keras

        loaded = keras.models.load_model(path)
        return lambda batch: loaded.predict_on_batch(batch.reshape(-1, *shape))

    return predict_batch_udf(make_predict_fn, return_type=ArrayType(FloatType()), batch_size=batch_size,
                             input_tensor_shapes=[[int(np.prod(shape))]])


def contenders(spark, name, count, batch_size):
    """name -> a run returning {"rows_per_s", "peak_mb"}; the one process's first."""
    model = build(name)
    path = os.path.join(harness.scratch_dir(prefix="tfbarrier-bench-"), f"{name}.keras")
    model.save(path)
    command = [sys.executable, __file__, "--one-process", path, "--model", name, "--rows", str(count),
               "--batch-size", str(batch_size)]
    local = {f"{name}: model.predict (1 process)": lambda: json.loads(
        subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])}
    return {**local, **spark_contenders(spark, name, model, path, count, batch_size)}


def section(args, results):
    lines = [f"`.venv/bin/python bench/predict_bench.py --rows {args.rows} --large-rows {args.large_rows} "
             f"--rounds {args.rounds}`: scoring {args.rows:,} rows with the slides' CNN (28x28x1) and "
             f"{args.large_rows:,} rows with the 61 M-parameter MLP (1024 inputs), batch {args.batch_size}, "
             "after one warm-up run of each; Spark output to the `noop` sink. Memory: the largest Spark Python "
             "worker's peak while scoring (sampled), or the one process's `ru_maxrss`.", "",
             "| contender | min rows/s | median rows/s | max rows/s | median / one process | peak MB per Python |",
             "|---|---|---|---|---|---|"]
    for name, rounds in results.items():
        model = name.split(":")[0]
        base = harness.stats([r["rows_per_s"] for r in results[f"{model}: model.predict (1 process)"]])[1]
        low, mid, high = harness.stats([r["rows_per_s"] for r in rounds])
        peak = harness.stats([r["peak_mb"] for r in rounds])[1]
        lines.append(f"| {name} | {low:,.0f} | {mid:,.0f} | {high:,.0f} | {mid / base:.2f} | {peak:,.0f} |")
    title = "Distributed inference" + ("" if harness.onednn_on() else " without oneDNN (TF_ENABLE_ONEDNN_OPTS=0)")
    return f"## {title}\n\n" + "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--large-rows", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--one-process", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_process:
        return one_process(args.one_process, args.model, args.rows, args.batch_size)

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results = {}
    for name, rows in (("cnn", args.rows), ("mlp61", args.large_rows)):  # a model's rounds together: a Python
        runs = contenders(spark, name, rows, args.batch_size)  # worker keeps two models, the output kinds of one
        for contender, run in runs.items():  # warm-up: Python workers, model caches, graphs
            print(f"warm-up {contender}: {run()}", flush=True)
        results.update(harness.rounds_of(runs, args.rounds, lambda line: print(line, flush=True)))
    body = section(args, results)
    harness.write_section("predict" if harness.onednn_on() else "predict-no-onednn", body)
    print(body)
    spark.stop()


if __name__ == "__main__":
    main()
