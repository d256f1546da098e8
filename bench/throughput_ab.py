"""Steady throughput of this tree's tfbarrier.fit against a git revision's, alone, alternated.

``fit_bench.py --baseline-ref`` runs the same comparison among all the peers (an hour); this runs
only the two, each as ``fit_bench.py --one-fit`` (a driver process and a Spark of its own, the slides'
CNN or the large model, 2 workers x 64, 60 (large: 15) steps x 4 epochs), one after the other for
``--rounds`` rounds, and prints the samples/s of epochs 2.. of each run and their median, min and max.

    .venv/bin/python bench/throughput_ab.py --baseline-ref 74a8fa1 [--rounds 8] [--model large]
    .venv/bin/python bench/throughput_ab.py --refs REV REV... [--rounds 8]   those revisions only
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import harness

BENCH = os.path.dirname(os.path.abspath(__file__))
EPOCHS, BATCH, WORKERS = 4, 64, 2
STEPS = {"cnn": 60, "large": 15}


def run_once(data, env, model):
    clock = tempfile.mktemp(prefix="tfbarrier-ab-clock-")
    subprocess.run([sys.executable, os.path.join(BENCH, "fit_bench.py"), "--one-fit", clock, "--data", data,
                    "--model", model, "--batch", str(BATCH), "--steps", str(STEPS[model]), "--epochs", str(EPOCHS)],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(clock) as f:
        ends = json.load(f)["epoch_ends"]
    os.remove(clock)
    return (EPOCHS - 1) * STEPS[model] * BATCH * WORKERS / (ends[-1] - ends[0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline-ref", help="this tree against that revision")
    parser.add_argument("--refs", nargs="+", help="these revisions against each other")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--model", choices=sorted(STEPS), default="cnn")
    args = parser.parse_args()
    if not (args.baseline_ref or args.refs):
        parser.error("give --baseline-ref or --refs")
    harness.local_spark_env()

    import workloads

    data = harness.scratch_dir(prefix="tfbarrier-ab-data-")
    workloads.make_data(data, STEPS[args.model] * BATCH * WORKERS)
    here = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (BENCH, os.environ.get("PYTHONPATH")) if p))
    envs = {} if args.refs else {"this tree": here}
    for ref in args.refs or [args.baseline_ref]:
        envs[ref] = dict(here, PYTHONPATH=os.pathsep.join([harness.worktree(ref), here["PYTHONPATH"]]))
    results = {name: [] for name in envs}
    for _ in range(args.rounds):
        for name, env in envs.items():
            harness.settle()
            results[name].append(run_once(data, env, args.model))
            print(f"{name}: {results[name][-1]:,.0f} samples/s", flush=True)
    for name, rates in results.items():
        print(f"{name}: median {statistics.median(rates):,.0f}, min {min(rates):,.0f}, max {max(rates):,.0f} samples/s")
    first, *others = results
    for name in others:
        print(f"{first} / {name}: {statistics.median(results[first]) / statistics.median(results[name]):.2f}")


if __name__ == "__main__":
    main()
