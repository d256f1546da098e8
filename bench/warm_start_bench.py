"""What warm start costs, this tree against a git revision's.

Each contender is a driver process with a local[2] Spark of its own (``--driver``): a cold fit, then
``--fits`` warm fits of the slides' CNN (2 workers x 64, ``--steps`` steps x 2 epochs), each once the machine
settled. Per contender: a warm fit's time from the call to its first finished step, the call's total, and
the CPU-seconds the whole machine spent per warm fit (/proc/stat, from the settled end of the cold fit to
the settled end of the last: what a fit's processes cost to start, wherever that work landed, the
TensorFlow imports of the processes a fit leaves for the next included). Rounds alternate the contenders.

    .venv/bin/python bench/warm_start_bench.py --baseline-ref f68997f [--fits 4] [--rounds 3]
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

import harness

BENCH = os.path.dirname(os.path.abspath(__file__))
BATCH, WORKERS = 64, 2


def busy_cpu_seconds():
    """CPU-seconds the machine has spent busy since boot (every CPU's user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def driver(out, data, fits, steps):
    """The ``--driver OUT`` process: the cold fit and the warm ones; their numbers as JSON to ``out``."""
    import keras
    import numpy as np
    import workloads
    from fit_bench import dataframe

    import tfbarrier

    spark = harness.local_spark()
    x, y = np.load(os.path.join(data, "x.npy")), np.load(os.path.join(data, "y.npy"))
    df = dataframe(spark, x, y, WORKERS)

    def fit(callbacks):
        result = tfbarrier.fit(df, workloads.build_model(keras, "cnn"), features="pixels", label="label", epochs=2,
                               batch_size=BATCH * WORKERS, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
        warm.append([w["warm_start"] for w in result.workers])

    warm = []
    cold = harness.clocked_fit(fit, len(x))
    harness.settle()
    before = busy_cpu_seconds()
    runs = [harness.clocked_fit(fit, len(x)) for _ in range(fits)]
    harness.settle()
    cpu = (busy_cpu_seconds() - before) / fits
    spark.stop()
    with open(out, "w") as f:
        json.dump({"cold_first_step": cold["first_step"], "first_step": statistics.median(r["first_step"] for r in runs),
                   "total": statistics.median(r["total"] for r in runs), "cpu_per_fit": cpu, "warm": warm[1:]}, f)


def run_contender(env, data, fits, steps):
    out = tempfile.mktemp(prefix="tfbarrier-warm-start-", suffix=".json")
    subprocess.run([sys.executable, __file__, "--driver", out, "--data", data, "--fits", str(fits), "--steps",
                    str(steps)], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    if not all(all(w) for w in result["warm"]):
        raise RuntimeError(f"a fit after the first started cold: {result['warm']}")
    return result


def main():
    parser = harness.driver_contenders_parser(fits=4, steps=10)
    args = parser.parse_args()
    harness.local_spark_env()
    if args.driver:
        return driver(args.driver, args.data, args.fits, args.steps)
    import workloads

    data = harness.scratch_dir(prefix="tfbarrier-warm-data-")
    workloads.make_data(data, args.steps * BATCH * WORKERS)
    here = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (BENCH, os.environ.get("PYTHONPATH")) if p))
    envs = {"this tree": here}
    if args.baseline_ref:
        envs[args.baseline_ref] = dict(here, PYTHONPATH=os.pathsep.join([harness.worktree(args.baseline_ref),
                                                                         here["PYTHONPATH"]]))
    results = harness.rounds_of({name: (lambda env=env: run_contender(env, data, args.fits, args.steps))
                                 for name, env in envs.items()}, args.rounds, log=print)
    body = [f"`{harness.command()}`: per contender a driver and a local[2] Spark of its own, a cold fit, then "
            f"{args.fits} warm fits of the slides' CNN (2 workers x {BATCH}, {args.steps} steps x 2 epochs), each "
            "once the machine settled; rounds alternate the contenders. CPU: the whole machine's busy CPU-seconds "
            "per warm fit, from the settled end of the cold fit to the settled end of the last (the TensorFlow "
            "imports of the processes a fit leaves for the next included).", ""]
    for metric, label in (("first_step", "warm time to first step (s)"), ("total", "warm fit's call (s)"),
                          ("cpu_per_fit", "busy CPU-seconds per warm fit"), ("cold_first_step", "cold time to first step (s)")):
        body += [f"{label}:", "", harness.metric_table(results, metric, "", "this tree", digits=2), ""]
    harness.write_section("warm-start", "\n".join(body))
    print("\n".join(body))


if __name__ == "__main__":
    main()
