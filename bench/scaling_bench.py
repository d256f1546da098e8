"""Scaling curve: steady samples/s of tfbarrier.fit with 1, 2 and 4 workers (per-worker batch 64, so
the global batch grows with the workers), next to the same number of MultiWorkerMirroredStrategy
processes started by hand without Spark, so the cost of each added worker is visible. Spark runs as
``local-cluster[4,1,1024]``: four executors of one core, each its own JVM, as on a real cluster.

    PYTHONPATH=build/bench-site .venv/bin/python bench/scaling_bench.py [--workers 1 2 4] [--rounds 3]
"""

import argparse

import fit_bench  # noqa: E402 - sets the environment Spark's workers inherit
import harness  # noqa: E402
import workloads  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", choices=workloads.MODELS, default="cnn")
    parser.add_argument("--batch", type=int, default=64, help="per-worker batch")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    most = max(args.workers)
    spark = fit_bench.spark_session(f"local-cluster[{most},1,1024]")
    data = harness.scratch_dir(prefix="tfbarrier-bench-data-")
    x, y = workloads.make_data(data, args.steps * args.batch * most)
    df = fit_bench.dataframe(spark, x, y, most)
    contenders = {}
    for n in args.workers:
        job = fit_bench.Job(args, data, workers=n)
        # Each worker trains on steps x batch rows of its own: the first n partitions' worth.
        frame = df.limit(args.steps * args.batch * n).repartition(n).cache()
        frame.count()
        contenders[f"tfbarrier.fit, {n} worker(s)"] = (job, fit_bench.tfbarrier_fit(frame, job))
        contenders[f"{n} process(es), no Spark"] = (job, fit_bench.hand_started_processes(job))
    log = lambda line: print(line, flush=True)  # noqa: E731
    for name, (job, run) in contenders.items():
        log(f"warm-up {name}: {job.measure(run)}")
    results = harness.rounds_of({name: (lambda job=job, run=run: job.measure(run))
                                 for name, (job, run) in contenders.items()}, args.rounds, log)
    lines = ["| workers | contender | min samples/s | median samples/s | max samples/s | median / 1 worker's |",
             "|---|---|---|---|---|---|"]
    for kind in ("tfbarrier.fit", "process(es), no Spark"):
        names = [name for name in results if kind in name]
        base = harness.stats([r["throughput"] for r in results[names[0]]])[1]
        for name, n in zip(names, args.workers):
            low, mid, high = harness.stats([r["throughput"] for r in results[name]])
            lines.append(f"| {n} | {kind} | {low:,.0f} | {mid:,.0f} | {high:,.0f} | {mid / base:.2f} |")
    body = ("## Scaling curve\n\n"
            f"`PYTHONPATH=build/bench-site .venv/bin/python bench/scaling_bench.py --workers "
            f"{' '.join(map(str, args.workers))} --rounds {args.rounds}`: steady samples/s (epochs 2..) of the "
            f"{args.model} model, per-worker batch {args.batch}, {args.steps} steps x {args.epochs} epochs, "
            f"Spark `local-cluster[{most},1,1024]`; one warm-up run of each first.\n\n" + "\n".join(lines))
    harness.write_section("scaling", body)
    print(body)
    spark.stop()


if __name__ == "__main__":
    main()
