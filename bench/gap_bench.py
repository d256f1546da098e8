"""What closes the gap between a 2-worker tfbarrier.fit and one TensorFlow process (the limit): the
default (one intra-op thread per worker, as Spark gives each task one CPU; steps_per_execution "auto"),
one step per call (the default before "auto"), fit's ``steps_per_execution`` fixed at 10 and 30, two
threads per worker, gradient packing (``communication={"bytes_per_pack": 64 MB}``), and a 4x larger per-worker batch
(against the limit at the same global batch). Steady samples/s (epochs 2..) of the slides' CNN,
interleaved as in fit_bench.py.

    .venv/bin/python bench/gap_bench.py [--rounds 3]
"""

import argparse

import fit_bench  # noqa: E402 - sets the environment Spark's workers inherit
import harness  # noqa: E402
import workloads  # noqa: E402

PACK = 64 * 2**20  # bytes_per_pack: every gradient of the CNN in one all-reduce


def main():
    args = fit_bench.rounds_steps_epochs()
    spark = fit_bench.spark_session("local[2]")
    jobs, frames = {}, {}
    for batch in (64, 256):
        data = harness.scratch_dir(prefix="tfbarrier-bench-data-")
        jobs[batch] = fit_bench.Job(argparse.Namespace(model="cnn", batch=batch, steps=args.steps,
                                                       epochs=args.epochs), data)
        x, y = workloads.make_data(data, args.steps * jobs[batch].global_batch)
        frames[batch] = fit_bench.dataframe(spark, x, y, 2)
    small, large = jobs[64], jobs[256]
    auto_counts = []
    contenders = {
        "single process, batch 128 (limit)": (small, fit_bench.single_process(small)),
        "tfbarrier.fit, 2 x 64 (default: 1 thread per worker, steps_per_execution auto)": (
            small, fit_bench.tfbarrier_fit(frames[64], small, counts=auto_counts)),
        "tfbarrier.fit, 2 x 64, steps_per_execution=1 (the default before auto)": (
            small, fit_bench.tfbarrier_fit(frames[64], small, steps_per_execution=1)),
        "tfbarrier.fit, 2 x 64, steps_per_execution=10": (
            small, fit_bench.tfbarrier_fit(frames[64], small, steps_per_execution=10)),
        "tfbarrier.fit, 2 x 64, steps_per_execution=30": (
            small, fit_bench.tfbarrier_fit(frames[64], small, steps_per_execution=30)),
        "tfbarrier.fit, 2 x 64, tf_threads=2": (small, fit_bench.tfbarrier_fit(frames[64], small, tf_threads=2)),
        "tfbarrier.fit, 2 x 64, bytes_per_pack=64 MB": (
            small, fit_bench.tfbarrier_fit(frames[64], small, communication={"bytes_per_pack": PACK})),
        "single process, batch 512 (limit)": (large, fit_bench.single_process(large)),
        "tfbarrier.fit, 2 x 256": (large, fit_bench.tfbarrier_fit(frames[256], large)),
    }
    log = lambda line: print(line, flush=True)  # noqa: E731
    for name, (job, run) in contenders.items():
        log(f"warm-up {name}: {job.measure(run)}")
    results = harness.rounds_of({name: (lambda job=job, run=run: job.measure(run))
                                 for name, (job, run) in contenders.items()}, args.rounds, log)
    body = ("## Closing the gap to one process\n\n"
            f"`.venv/bin/python bench/gap_bench.py --rounds {args.rounds}`: steady "
            f"samples/s (epochs 2..) of the slides' CNN, {args.steps} steps x {args.epochs} epochs, Spark `local[2]`; "
            "one warm-up run of each first.\n\n"
            + harness.metric_table(results, "throughput", "samples/s", "single process, batch 128 (limit)", digits=0)
            + f"\nThe default's steps per call (\"auto\"), per run and worker: {auto_counts}.\n")
    harness.write_section("gap", body)
    print(body)
    spark.stop()


if __name__ == "__main__":
    main()
