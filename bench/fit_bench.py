"""A warm tfbarrier.fit with 2 workers against the limit and the peers, the same training for each
(model, data, per-worker batch 64, steps, epochs; bench/workloads.py), interleaved round by round:

  single process     the limit: one plain TensorFlow process, no Spark, global batch 128
  2 processes        the floor for 2 workers: two MultiWorkerMirroredStrategy processes started by
                     hand with TF_CONFIG, no Spark
  spark-tf-distrib.  spark-tensorflow-distributor's MirroredStrategyRunner(num_slots=2, use_gpu=False)
  barrier by hand    a barrier stage that sets TF_CONFIG itself from the task addresses and fixed ports
                     and starts the same worker program as "2 processes" (what the slides do in R)
  tfbarrier.fit      from a cached 2-partition Spark DataFrame of the same rows
  ..., fp16          the same, with communication={"compression": "fp16"} (gradients all-reduced in float16)

Time to first step and total are from the call (or the processes' launch) to worker 0's first
finished step and to the return; throughput counts the samples of epochs 2.. over their time.
The peers read the rows from .npy files; tfbarrier reads them from the DataFrame.

    PYTHONPATH=build/bench-site .venv/bin/python bench/fit_bench.py [--model cnn|large] [--rounds 3]
        [--baseline-ref REV]   also tfbarrier.fit of git revision REV (and of this tree), each driven
                               from a process of its own: their throughput side by side
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(BENCH, "workloads.py")
# Spark's Python workers and tfbarrier's training processes import bench/workloads.py by name.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (BENCH, os.environ.get("PYTHONPATH")) if p)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402
import workloads  # noqa: E402

HANDWRITTEN_BASE_PORT = 12345  # the slides' fixed ports: 12345 + the task's partition id


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tf_config(workers, index):
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def workload_args(kind, job, batch, clock):
    return [sys.executable, WORKLOADS, kind, "--data", job.data, "--model", job.model, "--batch", str(batch),
            "--steps", str(job.steps), "--epochs", str(job.epochs), "--clock", clock]


def wait_all(processes):
    codes = [p.wait() for p in processes]
    if any(codes):
        raise RuntimeError(f"a training process failed: exit codes {codes}")


class Job:
    """One contender's run: the shared settings, and the clock file worker 0 writes."""

    def __init__(self, args, data, workers=2):
        self.model, self.steps, self.epochs, self.data = args.model, args.steps, args.epochs, data
        self.workers, self.batch = workers, args.batch
        self.global_batch = args.batch * workers

    def measure(self, run):
        clock = tempfile.mktemp(prefix="tfbarrier-bench-clock-", suffix=".json")
        harness.settle()
        started = time.time()
        run(clock)
        total = time.time() - started
        with open(clock) as f:
            marks = json.load(f)
        os.remove(clock)
        ends = marks["epoch_ends"]
        samples = (len(ends) - 1) * self.steps * self.global_batch
        return {"first_step": marks["first_step_end"] - started, "total": total,
                "throughput": samples / (ends[-1] - ends[0])}


def single_process(job, popen=subprocess.Popen):
    """The limit; ``popen`` starts it (bench/hosts_bench.py: on one host of a cluster)."""
    def run(clock):
        wait_all([popen(workload_args("single", job, job.global_batch, clock))])
    return run


def hand_started_processes(job):
    def run(clock):
        workers = [f"127.0.0.1:{free_port()}" for _ in range(job.workers)]
        wait_all([subprocess.Popen(workload_args("worker", job, job.batch, clock),
                                   env=dict(os.environ, TF_CONFIG=tf_config(workers, i)))
                  for i in range(job.workers)])
    return run


def distributor(job):
    from spark_tensorflow_distributor import MirroredStrategyRunner

    def train(clock):
        import tensorflow as tf

        workloads.train_worker(job.data, job.model, job.batch, job.steps, job.epochs, clock,
                               strategy=tf.distribute.get_strategy())

    def run(clock):
        MirroredStrategyRunner(num_slots=job.workers, use_gpu=False).run(train, clock=clock)
    return run


def barrier_by_hand(spark, job):
    def run(clock):
        command = workload_args("worker", job, job.batch, clock)

        def task(_):
            from pyspark import BarrierTaskContext

            context = BarrierTaskContext.get()
            hosts = [info.address.split(":")[0] for info in context.getTaskInfos()]
            workers = [f"{host}:{HANDWRITTEN_BASE_PORT + i}" for i, host in enumerate(hosts)]
            env = dict(os.environ, TF_CONFIG=tf_config(workers, context.partitionId()))
            subprocess.run(command, env=env, check=True)
            yield context.partitionId()

        spark.sparkContext.parallelize(range(job.workers), job.workers).barrier().mapPartitions(task).collect()
    return run


def tfbarrier_fit(df, job, tf_threads=None, timings=None, counts=None, **fit_kwargs):
    """tfbarrier.fit on ``df`` (``fit_kwargs``: more of fit's arguments, e.g. steps_per_execution or
    communication); appends each run's FitResult.timings to ``timings``, and the steps per call its
    workers ended with to ``counts``."""
    import keras

    import tfbarrier

    def run(clock):
        model = workloads.build_model(keras, job.model)
        result = tfbarrier.fit(df, model, features="pixels", label="label",
                               epochs=job.epochs, batch_size=job.global_batch, num_workers=job.workers,
                               steps_per_epoch=job.steps, tf_threads=tf_threads, verbose=0,
                               callbacks=lambda: [workloads.step_clock(clock)], **fit_kwargs)
        if timings is not None:
            timings.append(result.timings)
        if counts is not None:
            counts.append([worker["steps_per_execution"] for worker in result.workers])
    return run


def tfbarrier_fit_in_own_process(job, source=None, extra_env=None):
    """tfbarrier.fit driven by this script's ``--one-fit`` in a process, with a Spark, of its own; with
    ``source`` (an older revision's sources, see harness.worktree) first on its PYTHONPATH, and ``extra_env``
    (variables its Spark's training processes inherit). Its start-up includes Spark's: compare its
    throughput only."""
    def run(clock):
        env = dict(harness.env_with_source(source), **(extra_env or {}))
        subprocess.run([sys.executable, __file__, "--one-fit", clock, "--data", job.data, "--model", job.model,
                        "--batch", str(job.batch), "--steps", str(job.steps), "--epochs", str(job.epochs)],
                       env=env, check=True, stdout=subprocess.DEVNULL)
    return run


def rounds_steps_epochs(steps=60, epochs=3):
    """The arguments of a benchmark of fits of the slides' CNN: --rounds, --steps, --epochs."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--epochs", type=int, default=epochs)
    return parser.parse_args()


def one_fit(args):
    """The ``--one-fit CLOCK`` process: one tfbarrier.fit of the workload in ``args.data``."""
    import numpy as np

    job = Job(args, args.data)
    spark = spark_session("local[2]")
    df = dataframe(spark, np.load(os.path.join(args.data, "x.npy")), np.load(os.path.join(args.data, "y.npy")),
                   job.workers)
    tfbarrier_fit(df, job)(args.one_fit)
    spark.stop()


def spark_session(master):
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def dataframe(spark, x, y, partitions):
    import pandas as pd

    df = spark.createDataFrame(pd.DataFrame({"pixels": list(x), "label": y})).repartition(partitions).cache()
    df.count()
    return df


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=workloads.MODELS, default="cnn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64, help="per-worker batch")
    parser.add_argument("--steps", type=int, default=None, help="steps per epoch (default: cnn 60, large 15)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--baseline-ref", help="also run tfbarrier.fit of this git revision (and this tree's) "
                                               "each in a process of its own, for their throughput")
    parser.add_argument("--one-fit", metavar="CLOCK", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.steps = args.steps or {"cnn": 60, "large": 15}[args.model]
    return args


def contenders(args, job, spark, df, fit_timings):
    """Name -> run of each contender; "tfbarrier.fit" appends its runs' timings to ``fit_timings``."""
    runs = {
        "single process (limit)": single_process(job),
        "2 processes, no Spark (floor)": hand_started_processes(job),
        "spark-tensorflow-distributor": distributor(job),
        "barrier job by hand": barrier_by_hand(spark, job),
        "tfbarrier.fit": tfbarrier_fit(df, job, timings=fit_timings),
        "tfbarrier.fit, fp16 gradients": tfbarrier_fit(df, job, communication={"compression": "fp16"}),
    }
    if args.baseline_ref:
        runs["tfbarrier.fit, own process"] = tfbarrier_fit_in_own_process(job)
        runs[f"tfbarrier.fit @ {args.baseline_ref}, own process"] = tfbarrier_fit_in_own_process(
            job, harness.worktree(args.baseline_ref))
    return runs


def measure_rounds(job, runs, fit_timings, rounds):
    """A warm-up run of each contender, then ``rounds`` rounds of two runs of each in a row: (name -> its
    first runs' measures, name -> its second runs', tfbarrier.fit's timings of its second runs)."""
    log = lambda line: print(line, flush=True)  # noqa: E731
    for name, run in runs.items():  # warm-up: Spark's Python workers, imports, page cache
        log(f"warm-up {name}: {job.measure(run)}")
    warm_timings = []

    def twice(name, run):
        """Once after the other contenders ran (over a minute: Spark has retired the idle Python
        workers of this contender's pool), then again at once (its Python workers still up)."""
        measures = job.measure(run), job.measure(run)
        if name == "tfbarrier.fit":
            warm_timings.append(fit_timings[-1])
        return measures

    results = harness.rounds_of({name: (lambda name=name, run=run: twice(name, run))
                                 for name, run in runs.items()}, rounds, log)
    after_others = {name: [first for first, _ in measures] for name, measures in results.items()}
    again = {name: [second for _, second in measures] for name, measures in results.items()}
    return after_others, again, warm_timings


def setup_text(args, job, images):
    """The section's first paragraph: the command, the workload, how the rounds run."""
    return (f"`PYTHONPATH=build/bench-site .venv/bin/python bench/fit_bench.py --model {args.model} "
            f"--rounds {args.rounds}"
            + (f" --baseline-ref {args.baseline_ref}" if args.baseline_ref else "")
            + f"`: {job.workers} workers, per-worker batch {job.batch} (global {job.global_batch}), "
            f"{job.steps} steps x {job.epochs} epochs on {images:,} random 28x28 images; Spark `local[2]` "
            "already up; one warm-up run of each contender first. Each round runs every contender twice in a "
            "row: the first run comes after the other contenders' (over a minute, so Spark has retired the "
            "idle Python workers of its pool, and with them spark-tensorflow-distributor's imported TensorFlow; "
            "tfbarrier's spare training processes belong to the executor and outlive them), the second right "
            "after the first."
            + (" The two \"own process\" contenders drive tfbarrier.fit from a process with a Spark of its "
               f"own, this tree's and revision {args.baseline_ref}'s: their times include Spark's start-up, "
               "so compare their throughput." if args.baseline_ref else ""))


def report(args, job, images, after_others, again, warm_timings):
    floor = "2 processes, no Spark (floor)"
    return (f"## Fit, {args.model} model: time to first step, total, throughput\n\n"
            + setup_text(args, job, images)
            + "\n\n"
            "Time to first step, right after its own previous run (s, from the call to worker 0's first "
            "finished step):\n\n"
            + harness.metric_table(again, "first_step", "s", floor)
            + "\n\nTime to first step, after the other contenders (s):\n\n"
            + harness.metric_table(after_others, "first_step", "s", floor)
            + "\n\nTotal, right after its own previous run (s, from the call to its return):\n\n"
            + harness.metric_table(again, "total", "s", floor)
            + "\n\nSteady throughput (samples/s over epochs 2.., both runs of each round):\n\n"
            + harness.metric_table({name: after_others[name] + again[name] for name in again}, "throughput",
                                   "samples/s", floor, digits=0)
            + "\n\ntfbarrier.fit's own timings, right after its previous run (median s): "
            + ", ".join(f"{key} {harness.stats([t[key] for t in warm_timings])[1]:.2f}"
                        for key in warm_timings[0] if all(key in t for t in warm_timings)))


def main():
    args = parse_args()
    if args.one_fit:
        return one_fit(args)

    data = harness.scratch_dir(prefix="tfbarrier-bench-data-")
    job = Job(args, data)
    x, y = workloads.make_data(data, job.steps * job.global_batch)
    spark = spark_session("local[2]")
    df = dataframe(spark, x, y, job.workers)
    fit_timings = []
    runs = contenders(args, job, spark, df, fit_timings)
    after_others, again, warm_timings = measure_rounds(job, runs, fit_timings, args.rounds)
    body = report(args, job, len(x), after_others, again, warm_timings)
    harness.write_section(f"fit-{args.model}", body)
    print(body)
    spark.stop()


if __name__ == "__main__":
    main()
