"""What the protection costs a fit (issue 44), 2 workers on local[2], contenders interleaved round by round
in one driver after one warm-up fit of each:

- ``--path native`` (a Keras 3 model trained natively): its driver link and ring in plain TCP
  (spark.tfbarrier.encrypt=auto, Spark not encrypting) and over TLS 1.3 (spark.tfbarrier.encrypt=always:
  what a cluster with spark.network.crypto.enabled gets);
- ``--path translated`` (the model rebuilt in tf_keras): under MultiWorkerMirroredStrategy (TensorFlow's
  open gRPC server, its RING collective: exchange "strategy"), over tfbarrier's ring in
  plain TCP (the default, "auto"), and over the ring in TLS 1.3 (encrypt=always).

Models and rows: bench/keras3_paths_bench.py's (the slides' CNN, Adam, per-worker batch 64; the 61 M MLP,
Adam, per-worker batch 32). Per fit: time from the call to worker 0's first finished step, samples/s of
epochs 2.., and the ring's and link's encryption as the workers report it (checked).

    .venv/bin/python bench/encryption_bench.py [--rounds 3] [--models cnn mlp61-adam] [--path native]
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

# per path: contender -> (spark.tfbarrier.encrypt, fit's exchange arguments); the first is the base
STRATEGY = {"exchange": "strategy", "communication": {"implementation": "ring"}}
CONTENDERS = {"native": {"plain": ("auto", {}), "TLS 1.3": ("always", {})},
              "translated": {"strategy": ("auto", STRATEGY), "ring": ("auto", {}), "ring, TLS 1.3": ("always", {})}}


def contenders_on(path):
    def contender(spark, df, rows, name, how):
        import tfbarrier

        settings, (encrypt, exchange) = paths.MODELS[name], CONTENDERS[path][how]

        def run():
            spark.conf.set("spark.tfbarrier.keras3Training", path)
            spark.conf.set("spark.tfbarrier.encrypt", encrypt)
            model = paths.model_of(name)

            def fit(callbacks):
                result = tfbarrier.fit(df, model, features="pixels", label="label", epochs=settings["epochs"],
                                       batch_size=settings["batch"], num_workers=2, steps_per_epoch=settings["steps"],
                                       verbose=0, callbacks=callbacks, **exchange)
                for worker in result.workers:
                    assert worker["communication"]["implementation"].startswith("tfbarrier") == (how != "strategy")
                    for encryption in (worker["communication"].get("encryption", "none"),
                                       worker["transfer"]["encryption"]):
                        assert encryption.startswith("TLSv1.3") == ("TLS" in how), encryption

            return harness.clocked_fit(fit, rows)
        return run
    return contender


def section_on(path):
    def section(name, results, rounds):
        kinds = list(CONTENDERS[path])
        lines = [f"Keras 3 model `{name}`, {path} path, 2 workers, local[2], {rounds} interleaved rounds after a "
                 f"warm-up fit of each; ratios: each against {kinds[0]} (medians).", "",
                 "| contender | time to first step, s (min / median / max) | samples/s (min / median / max) "
                 f"| first step / {kinds[0]} | samples/s / {kinds[0]} |", "|---|---|---|---|---|"]
        base = {m: statistics.median(r[m] for r in results[kinds[0]]) for m in ("first_step", "throughput")}
        for how in kinds:
            cells = [" / ".join(f"{v:,.1f}" for v in harness.stats([r[m] for r in results[how]]))
                     for m in ("first_step", "throughput")]
            ratios = [statistics.median(r[m] for r in results[how]) / base[m] for m in ("first_step", "throughput")]
            lines.append(f"| {how} | {cells[0]} | {cells[1]} | {ratios[0]:.2f} | {ratios[1]:.2f} |")
        return "\n".join(lines)
    return section


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(paths.MODELS))
    parser.add_argument("--path", choices=list(CONTENDERS), default="native")
    args = parser.parse_args()
    spark = harness.local_spark()
    body = [f"Run by `.venv/bin/python bench/encryption_bench.py --rounds {args.rounds} --models "
            f"{' '.join(args.models)} --path {args.path}` (see its docstring)."]
    body += paths.measured_sections(spark, args.models, args.rounds, contenders_on(args.path),
                                    CONTENDERS[args.path], section_on(args.path))
    harness.write_section(f"encryption-{args.path}", "\n\n".join(body))


if __name__ == "__main__":
    main()
