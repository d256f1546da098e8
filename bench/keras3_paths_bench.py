"""Which path a Keras 3 model should take (issue 42): the same tfbarrier.fit of the same Keras 3 model,
2 workers on local[2], through

  translated   rebuilt in tf_keras, trained under MultiWorkerMirroredStrategy (TensorFlow's collectives)
  native       trained in Keras 3 as it is, gradients summed over tfbarrier's authenticated ring

(spark.tfbarrier.keras3Training), interleaved round by round in one driver, after one warm-up fit of
each. Models: the slides' CNN (bench/workloads.py "cnn", Adam, per-worker batch 64) and the 61 M MLP
(bench/large_model_bench.py "mlp61-adam", per-worker batch 32). Per fit: time from the call to worker
0's first finished step, samples/s of epochs 2.., and the peak resident memory of each training process
(its ru_maxrss, as FitResult.workers reports it).

    .venv/bin/python bench/keras3_paths_bench.py [--rounds 3] [--models cnn mlp61-adam]
"""

import argparse
import os
import statistics
import sys
import tempfile

BENCH = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (BENCH, os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, BENCH)
import harness  # noqa: E402

harness.local_spark_env()

PATHS = ("translated", "native")
MODELS = {"cnn": {"steps": 40, "epochs": 3, "batch": 128}, "mlp61-adam": {"steps": 4, "epochs": 3, "batch": 64}}


def frame(spark, name):
    """(the cached 2-partition DataFrame of the model's rows, its feature column, rows per epoch)."""
    import numpy as np

    import large_model_bench
    import workloads

    settings = MODELS[name]
    rows = settings["steps"] * settings["batch"]
    if name == "cnn":
        with tempfile.TemporaryDirectory() as tmp:
            x, y = workloads.make_data(tmp, rows)
    else:
        x, y = large_model_bench.data(rows)
    df = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, np.asarray(y))], ["pixels", "label"])
    return df.repartition(2).cache(), rows


def model_of(name):
    import keras

    import large_model_bench
    import workloads

    return workloads.build_model(keras, "cnn") if name == "cnn" else large_model_bench.build(keras, name)


def contender(spark, df, rows, name, path):
    import tfbarrier

    settings = MODELS[name]

    def run():
        spark.conf.set("spark.tfbarrier.keras3Training", path)
        model = model_of(name)
        peaks = []

        def fit(callbacks):
            result = tfbarrier.fit(df, model, features="pixels", label="label", epochs=settings["epochs"],
                                   batch_size=settings["batch"], num_workers=2, steps_per_epoch=settings["steps"],
                                   verbose=0, callbacks=callbacks)
            implementation = result.workers[0]["communication"]["implementation"]
            assert implementation.startswith("tfbarrier") == (path == "native"), implementation
            peaks.extend(worker["memory"]["peak_mb"] for worker in result.workers)

        measured = harness.clocked_fit(fit, rows)
        return {**measured, "peak_mb": max(peaks)}
    return run


def section(name, results, rounds):
    lines = [f"Keras 3 model `{name}`, 2 workers, local[2], {rounds} interleaved rounds after a warm-up fit of each "
             "path; ratio: native / translated (medians).", "",
             "| path | time to first step, s (min / median / max) | samples/s (min / median / max) | "
             "training process peak, MB (median) |", "|---|---|---|---|"]
    for path in PATHS:
        runs = results[path]
        cells = [" / ".join(f"{v:,.1f}" for v in harness.stats([r[m] for r in runs])) for m in ("first_step", "throughput")]
        lines.append(f"| {path} | {cells[0]} | {cells[1]} | {statistics.median(r['peak_mb'] for r in runs):,.0f} |")
    ratio = {m: statistics.median(r[m] for r in results["native"]) / statistics.median(r[m] for r in results["translated"])
             for m in ("first_step", "throughput", "peak_mb")}
    lines.append(f"| native / translated | {ratio['first_step']:.2f} | {ratio['throughput']:.2f} | "
                 f"{ratio['peak_mb']:.2f} |")
    return "\n".join(lines)


def measured_sections(spark, models, rounds, contender, kinds, section):
    """Per model: ``contender(spark, df, rows, model, kind)`` for each of ``kinds``, one warm-up fit of each,
    then ``rounds`` interleaved rounds; ``section(model, results, rounds)``'s table, printed as it comes."""
    sections = []
    for name in models:
        df, rows = frame(spark, name)
        contenders = {kind: contender(spark, df, rows, name, kind) for kind in kinds}
        for run in contenders.values():  # warm-up: spares, Spark's and TensorFlow's first-time costs
            run()
        results = harness.rounds_of(contenders, rounds, log=print)
        sections.append(section(name, results, rounds))
        print(sections[-1], flush=True)
    return sections


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    args = parser.parse_args()
    spark = harness.local_spark()
    body = ["Run by `.venv/bin/python bench/keras3_paths_bench.py --rounds "
            f"{args.rounds} --models {' '.join(args.models)}` (see its docstring)."]
    body += measured_sections(spark, args.models, args.rounds, contender, PATHS, section)
    harness.write_section("keras3-paths", "\n\n".join(body))  # under its heading and reading, written by hand


if __name__ == "__main__":
    main()
