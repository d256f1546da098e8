"""What the driver link's proof and the files' digests cost (issue 72), this tree against a git revision's.

Each contender is a driver process with a local[2] Spark of its own (``--driver``): a warm-up fit, then per
model (the slides' CNN, 0.4 MB of weights; the 59 M-parameter MLP, 237 MB) ``--fits`` fits (2 workers x 64,
``--steps`` steps), each once the machine settled, and as many first calls of ``predict`` of a model never
served before (its weights served to the executors, fetched, checked and loaded; 256 rows). Per contender: a
fit's time from the call to the chief's first finished step (``timings["time_to_first_step"]``), and predict's first call (collect). Every connection of
this tree's link proves the job's token over a nonce, and every file that crosses is hashed (SHA-256) on both
ends; the revision's sends the token and hashes nothing. Rounds alternate the contenders.

    .venv/bin/python bench/link_bench.py --baseline-ref a882286 [--fits 2] [--rounds 3]
"""

import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import harness

BENCH = os.path.dirname(os.path.abspath(__file__))
BATCH, WORKERS, PREDICT_ROWS = 64, 2, 256
MODELS = ("cnn", "mlp")


def driver(out, data, fits, steps):
    """The ``--driver OUT`` process: its fits and predicts; their numbers as JSON to ``out``."""
    import keras
    import numpy as np
    import workloads
    from fit_bench import dataframe

    import tfbarrier

    spark = harness.local_spark()
    x, y = np.load(os.path.join(data, "x.npy")), np.load(os.path.join(data, "y.npy"))
    df = dataframe(spark, x, y, WORKERS)
    scored = df.limit(PREDICT_ROWS).cache()
    scored.count()

    def fit(kind):
        harness.settle()
        result = tfbarrier.fit(df, workloads.build_model(keras, kind), features="pixels", label="label", epochs=1,
                               batch_size=BATCH * WORKERS, steps_per_epoch=steps, verbose=0)
        return result.timings["time_to_first_step"]

    def first_predict(kind):
        model = workloads.build_model(keras, kind)  # new weights: served, fetched and loaded anew
        harness.settle()
        started = time.perf_counter()
        rows = tfbarrier.predict(scored, model, features="pixels").collect()
        assert len(rows) == PREDICT_ROWS
        return time.perf_counter() - started

    fit("cnn")  # warm-up: Python workers, keepers, the page cache
    first_predict("cnn")
    numbers = {}
    for kind in MODELS:
        numbers[f"first_step_{kind}"] = statistics.median(fit(kind) for _ in range(fits))
        numbers[f"predict_{kind}"] = statistics.median(first_predict(kind) for _ in range(fits))
    spark.stop()
    with open(out, "w") as f:
        json.dump(numbers, f)


def run_contender(env, data, fits, steps):
    out = tempfile.mktemp(prefix="tfbarrier-link-bench-", suffix=".json")
    log = open(out + ".log", "w")
    subprocess.run([sys.executable, __file__, "--driver", out, "--data", data, "--fits", str(fits), "--steps",
                    str(steps)], env=env, check=True, stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    os.remove(log.name)
    return result


def sha256_rate(megabytes=256):
    """This machine's SHA-256 in MB/s over ``megabytes`` in memory: what hashing a file costs once it is read."""
    data = os.urandom(2**20) * megabytes
    started = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    return megabytes / (time.perf_counter() - started)


def main():
    parser = harness.driver_contenders_parser(fits=2, steps=5)
    args = parser.parse_args()
    harness.local_spark_env()
    if args.driver:
        return driver(args.driver, args.data, args.fits, args.steps)
    if not args.baseline_ref:
        parser.error("--baseline-ref is required: the revision this tree is measured against")
    import workloads

    data = harness.scratch_dir(prefix="tfbarrier-link-data-")
    workloads.make_data(data, args.steps * BATCH * WORKERS)
    here = harness.env_with_source(BENCH)
    envs = {"this tree": here, args.baseline_ref: harness.env_with_source(os.pathsep.join(
        [harness.worktree(args.baseline_ref), BENCH]))}
    results = harness.rounds_of({name: (lambda env=env: run_contender(env, data, args.fits, args.steps))
                                 for name, env in envs.items()}, args.rounds, log=print)
    body = [f"`{harness.command()}`: per contender a driver and a local[2] Spark of its own; after a warm-up fit "
            f"and predict, per model {args.fits} fits (2 workers x {BATCH}, {args.steps} steps) and {args.fits} "
            f"first calls of predict of a model never served before ({PREDICT_ROWS} rows, collected), each once the "
            "machine settled, their median per round; rounds alternate the contenders. The slides' CNN has 0.4 MB "
            "of weights, the MLP 237 MB (what the digests hash: on the driver once per file, in each task as it "
            f"streams in). SHA-256 on this machine: {sha256_rate():,.0f} MB/s.", ""]
    for kind in MODELS:
        for metric, label in ((f"first_step_{kind}", f"{kind}: time to first step (s)"),
                              (f"predict_{kind}", f"{kind}: predict's first call (s)")):
            body += [f"{label}:", "", harness.metric_table(results, metric, "", "this tree", digits=2), ""]
    harness.write_section("link-cost", "\n".join(body))
    print("\n".join(body))


if __name__ == "__main__":
    main()
