"""The optimizer's state sharded over the ring (issue 74; communication={"shard": "optimizer"}) beside today's
replicated state: MLPs (input 1024, 10 outputs) trained with Adam by 2 and 4 workers on one local[N] Spark, the
two contenders in turn, round by round: the large-model bench's (two hidden layers, the second of most of the
weights) and a deep one of 16 equal layers. The first kind's large matrix is cut into a block of rows per worker
(exchange/placement.py), the second's layers go whole: the two ways the state is spread. A third contender is
the floor no sharding of the optimizer's state can go below: the same model replicated with plain SGD, which
keeps no state at all (what remains is the weights, their gradients and the step's own temporaries).

Per fit it records each training process's peak resident memory (``result.workers[i]["memory"]``: its peak, its
growth over TensorFlow's baseline before the model, and the memory check's estimate the process made, issue 74's
item 3), and the steps per second of the fit's training (its
steps over ``timings["training"]``, which counts the first calls' trace of the step: the sharded step's is the
heavier, and more steps a fit weigh it less). The table gives the medians over
rounds of the workers' largest peak, and each ratio to the replicated fit of the same model and workers.

    .venv/bin/python bench/sharded_bench.py [--rounds 2] [--models mlp61:2 deep65:2 deep65:4] [--steps 32]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import harness  # noqa: E402

harness.local_spark_env()

INPUT, OUTPUTS, BATCH, STEPS = 1024, 10, 64, 32
# (hidden width, hidden layers): large_model_bench's 61 M and 250 M models, whose second layer holds 87% and 94%
# of their weights; and 65 M parameters in 16 layers of 2048 (one matrix, 6% of them, at most)
MODELS = {"mlp61": (7310, 2), "mlp250": (15300, 2), "deep65": (2048, 16)}
CONTENDERS = {"replicated": ({}, "adam"), "sharded": ({"shard": "optimizer"}, "adam"),
              "no state (plain SGD)": ({}, "sgd")}  # name: (communication, optimizer)


def build(name, optimizer="adam"):
    import keras

    hidden, layers = MODELS[name]
    model = keras.Sequential([keras.Input((INPUT,)), *[keras.layers.Dense(hidden, activation="relu")
                                                      for _ in range(layers)], keras.layers.Dense(OUTPUTS)])
    model.compile(optimizer=keras.optimizers.Adam(1e-4) if optimizer == "adam" else keras.optimizers.SGD(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def driver(model_name, workers, rounds, steps):
    """In a process of its own (one Spark of ``workers`` slots): the rounds of both contenders, as JSON lines."""
    import numpy as np
    import pandas as pd

    import tfbarrier

    spark = harness.local_spark(**{"spark.master": f"local[{workers}]"})
    rng = np.random.default_rng(0)
    rows = BATCH * steps
    frame = pd.DataFrame({"x": list(rng.random((rows, INPUT), dtype=np.float32)), "y": rng.integers(0, OUTPUTS, rows)})
    df = spark.createDataFrame(frame).repartition(workers).cache()
    df.count()
    # untimed: the first fit's processes import TensorFlow themselves, the next are forked warm (a lower baseline)
    tfbarrier.fit(df, build(model_name), features="x", label="y", batch_size=BATCH, num_workers=workers, epochs=1,
                  steps_per_epoch=1, verbose=0)
    for number in range(rounds):
        for name, (communication, optimizer) in CONTENDERS.items():
            harness.settle()
            result = tfbarrier.fit(df, build(model_name, optimizer), features="x", label="y", batch_size=BATCH,
                                   num_workers=workers, epochs=1, communication=communication, verbose=0)
            peaks = [w["memory"]["peak_mb"] for w in result.workers]
            growth = [w["memory"]["peak_mb"] - w["memory"]["tensorflow_mb"] for w in result.workers]
            chief = result.workers[0]
            print("ROUND " + json.dumps({"round": number, "contender": name, "peak_mb": max(peaks),
                                         "growth_mb": max(growth),
                                         "estimate_mb": max(w["memory"]["estimate_mb"] for w in result.workers),
                                         "steps_per_second": chief["steps"] / chief["timings"]["training"]}),
                  flush=True)
    spark.stop()


def table(runs):
    lines = ["| model, workers | contender | worker's peak MB | its growth over TensorFlow MB | peak / replicated "
             "| steps/s | steps/s / replicated | the check's estimate / peak |", "|---|---|---|---|---|---|---|---|"]
    for (model_name, workers), rounds in runs.items():
        medians = {name: {metric: statistics.median(r[metric] for r in rounds if r["contender"] == name)
                          for metric in ("peak_mb", "growth_mb", "steps_per_second", "estimate_mb")}
                    for name in CONTENDERS}
        base = medians["replicated"]
        for name, m in medians.items():
            lines.append(f"| {model_name}, {workers} | {name} | {m['peak_mb']:,.0f} | {m['growth_mb']:,.0f} | "
                         f"{m['peak_mb'] / base['peak_mb']:.2f} | {m['steps_per_second']:.2f} | "
                         f"{m['steps_per_second'] / base['steps_per_second']:.2f} | "
                         f"{m['estimate_mb'] / m['peak_mb']:.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["mlp61:2", "deep65:2", "deep65:4"])
    parser.add_argument("--steps", type=int, default=STEPS, help="steps a fit (the first calls' trace timed)")
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        model_name, workers = args.driver.split(":")
        return driver(model_name, int(workers), args.rounds, args.steps)
    runs = {}
    for spec in args.models:
        model_name, workers = spec.split(":")
        out = subprocess.run([sys.executable, __file__, "--driver", spec, "--rounds", str(args.rounds),
                              "--steps", str(args.steps)],
                             capture_output=True, text=True, check=True).stdout
        runs[(model_name, int(workers))] = [json.loads(line[6:]) for line in out.splitlines() if line.startswith("ROUND ")]
        print(spec, runs[(model_name, int(workers))], flush=True)
    harness.write_section("sharded-optimizer", "### The optimizer's state sharded over the ring\n\n"
                          f"Adam, global batch 64, {args.steps} steps a fit; medians over rounds, the contenders in "
                          "turn (`bench/sharded_bench.py`); the floor, plain SGD replicated, keeps no optimizer state "
                          "at all.\n\n" + table(runs))


if __name__ == "__main__":
    main()
