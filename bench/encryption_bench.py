"""What encryption costs a fit (issue 44): the same native Keras 3 fit, 2 workers on local[2], with its
driver link and ring in plain TCP (spark.tfbarrier.encrypt=auto, Spark not encrypting) and over TLS 1.3
(spark.tfbarrier.encrypt=always: what a cluster with spark.network.crypto.enabled gets), interleaved
round by round in one driver, after one warm-up fit of each. Models and rows: bench/keras3_paths_bench.py's
(the slides' CNN, Adam, per-worker batch 64; the 61 M MLP, Adam, per-worker batch 32). Per fit: time from
the call to worker 0's first finished step, samples/s of epochs 2.., and the ring's and link's encryption
as the workers report it (checked).

    .venv/bin/python bench/encryption_bench.py [--rounds 3] [--models cnn mlp61-adam]
"""

import argparse
import os
import statistics
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (BENCH, os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, BENCH)
import harness  # noqa: E402
import keras3_paths_bench as paths  # noqa: E402

harness.local_spark_env()

SETTINGS = {"plain": "auto", "TLS 1.3": "always"}  # spark.tfbarrier.encrypt


def contender(spark, df, rows, name, how):
    import tfbarrier

    settings = paths.MODELS[name]

    def run():
        spark.conf.set("spark.tfbarrier.keras3Training", "native")
        spark.conf.set("spark.tfbarrier.encrypt", SETTINGS[how])
        model = paths.model_of(name)

        def fit(callbacks):
            result = tfbarrier.fit(df, model, features="pixels", label="label", epochs=settings["epochs"],
                                   batch_size=settings["batch"], num_workers=2, steps_per_epoch=settings["steps"],
                                   verbose=0, callbacks=callbacks)
            for worker in result.workers:
                for encryption in (worker["communication"]["encryption"], worker["transfer"]["encryption"]):
                    assert encryption.startswith("TLSv1.3") == (how != "plain"), encryption

        return harness.clocked_fit(fit, rows)
    return run


def section(name, results, rounds):
    lines = [f"Keras 3 model `{name}`, native path, 2 workers, local[2], {rounds} interleaved rounds after a "
             "warm-up fit of each; ratio: TLS / plain (medians).", "",
             "| traffic | time to first step, s (min / median / max) | samples/s (min / median / max) |", "|---|---|---|"]
    for how in SETTINGS:
        cells = [" / ".join(f"{v:,.1f}" for v in harness.stats([r[m] for r in results[how]]))
                 for m in ("first_step", "throughput")]
        lines.append(f"| {how} | {cells[0]} | {cells[1]} |")
    ratio = {m: statistics.median(r[m] for r in results["TLS 1.3"]) / statistics.median(r[m] for r in results["plain"])
             for m in ("first_step", "throughput")}
    lines.append(f"| TLS / plain | {ratio['first_step']:.2f} | {ratio['throughput']:.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(paths.MODELS))
    args = parser.parse_args()
    spark = harness.local_spark()
    body = ["## What encryption costs", "",
            f"Run by `.venv/bin/python bench/encryption_bench.py --rounds {args.rounds} --models "
            f"{' '.join(args.models)}` (see its docstring)."]
    body += paths.measured_sections(spark, args.models, args.rounds, contender, SETTINGS, section)
    harness.write_section("encryption", "\n\n".join(body))


if __name__ == "__main__":
    main()
