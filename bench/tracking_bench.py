"""The cost of experiment tracking on a fit: tfbarrier.fit with 2 workers on local[2], the slides' CNN on
random 28x28 images from one cached DataFrame, without tracking and with ``mlflow=True`` (a run in a
local SQLite store, MLflow's default kind, in a temporary directory), interleaved round by round.

Time to first step is from the fit() call to worker 0's first finished step (tracking adds the run's
creation and its parameters before the stage); throughput counts the samples of epochs 2.. over their
time (tracking adds the epochs' metrics, logged from the driver); total is the fit() call (tracking adds
the model, the figure and the timings at the end). The MLflow import is paid once, in the warm-up.

    PYTHONPATH=bench .venv/bin/python bench/tracking_bench.py [--rows 8192] [--epochs 4] [--rounds 3]
"""

import argparse
import os
import shutil
import sys
import tempfile

BENCH = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (BENCH, os.environ.get("PYTHONPATH")) if p)

import harness  # noqa: E402
import workloads  # noqa: E402


def fit_with(df, tracking, args):
    """A contender: one fit, tracked to ``tracking`` (mlflow=) or not; its times and throughput."""
    import keras

    import tfbarrier

    def fit(callbacks):
        result = tfbarrier.fit(df, workloads.build_model(keras, "cnn"), features="pixels", label="label",
                               epochs=args.epochs, batch_size=args.batch, num_workers=2, verbose=0, mlflow=tracking,
                               callbacks=callbacks)
        assert (result.mlflow_run_id is None) == (tracking is None)

    return lambda: harness.clocked_fit(fit, args.rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    harness.local_spark_env()
    import mlflow
    store = tempfile.mkdtemp(prefix="tfbarrier-bench-mlflow-")
    mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
    # Artifacts go with the store: a SQLite store's default experiment keeps them in ./mlruns.
    mlflow.set_experiment(experiment_id=mlflow.create_experiment("bench", artifact_location=f"{store}/artifacts"))
    spark = harness.local_spark()
    x, y = workloads.make_data(store, args.rows)
    df = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)], ["pixels", "label"])
    df = df.repartition(2).cache()
    df.count()
    contenders = {"no tracking": fit_with(df, None, args), "mlflow=True": fit_with(df, True, args)}
    for run in contenders.values():
        run()  # warm: spares, TensorFlow's caches, the JVM's code, MLflow's import and store
    results = harness.rounds_of(contenders, args.rounds, log=lambda line: print(line, file=sys.stderr))
    body = (f"## Experiment tracking: a fit with and without MLflow\n\n"
            f"`PYTHONPATH=bench .venv/bin/python bench/tracking_bench.py --rows {args.rows} --epochs {args.epochs} "
            f"--rounds {args.rounds}`: tfbarrier.fit, 2 workers, local[2], the slides' CNN (Adam) on {args.rows:,} "
            f"random 28x28 images, global batch {args.batch}, {args.epochs} epochs; `mlflow=True` logs to a local "
            f"SQLite store (MLflow {mlflow.__version__}): parameters, a point per epoch per metric, the timings, the "
            f"model and the figure. One warm-up fit each, then {args.rounds} rounds in turn.\n\n"
            "Time to first step (s, from the call):\n\n"
            + harness.metric_table(results, "first_step", "s", "no tracking", digits=2)
            + "\n\nSteady throughput (samples/s over epochs 2..):\n\n"
            + harness.metric_table(results, "throughput", "samples/s", "no tracking", digits=0)
            + "\n\nTotal (s, the fit() call; with tracking, the model and the figure logged at the end):\n\n"
            + harness.metric_table(results, "total", "s", "no tracking", digits=2))
    harness.write_section("tracking", body)
    print(body)
    spark.stop()
    shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
