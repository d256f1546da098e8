"""The largest Adam model this machine's 2 workers train (issue 74), its optimizer's state replicated (the default)
and sharded over the ring (``communication={"shard": "optimizer"}``): deep MLPs of layers of 4096 (input 1024,
10 outputs; 16.8 M parameters, 64 MB of float32, a layer), whose weights are many layers, none over a few percent
of them: the models sharding is for (one of two large matrices sheds little: bench/README.md).

For each contender, in a driver of its own: the largest number of layers the memory check accepts with what this
machine has available when the driver starts (``worker_memory.executor_budget``: the share the check on the
driver gives each worker; the model's size from its shapes, never built on the driver), then one fit of it: a
model function (each training process builds the model, seeded; the weights stay off the driver), Adam, global
batch 64, STEPS steps, 2 workers on local[2] at Spark's defaults, the memory check on (a model function's is made
by the training process on its host). A fit the check refuses there (the host had less than the driver saw) is
retried a layer smaller. It records the parameters, the budget, the check's estimate, each training process's
peak, seconds a step, and whether the loss stayed finite; and what the check says of the sharded contender's
model replicated.

    .venv/bin/python bench/largest_model_bench.py
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import harness  # noqa: E402

harness.local_spark_env()

INPUT, WIDTH, OUTPUTS, BATCH, STEPS, WORKERS = 1024, 4096, 10, 64, 3, 2
CONTENDERS = {"replicated": None, "sharded": {"shard": "optimizer"}}  # name: communication
TRIES = 3  # fits a layer smaller each, where a training process's check refuses the driver's largest


def size_of(layers, sharded):
    """The memory check's size of the deep MLP of ``layers`` hidden layers with Adam, from its shapes."""
    from tfbarrier.models import memory
    from tfbarrier.spark.training_process import onednn_on

    shapes = ([((INPUT, WIDTH), 4), ((WIDTH,), 4)] + [((WIDTH, WIDTH), 4), ((WIDTH,), 4)] * (layers - 1)
              + [((WIDTH, OUTPUTS), 4), ((OUTPUTS,), 4)])
    weights = sum(4 * math.prod(shape) for shape, _ in shapes)
    size = memory.ModelSize(weights=weights, trainable=weights, slots=2, optimizer="Adam", inputs=4 * INPUT,
                            activations=4 * (WIDTH * layers + OUTPUTS), shapes=tuple(shapes),
                            pooled=onednn_on() is not True)
    return size.sharded(WORKERS) if sharded else size


def parameters(layers):
    return INPUT * WIDTH + WIDTH + (layers - 1) * (WIDTH * WIDTH + WIDTH) + WIDTH * OUTPUTS + OUTPUTS


def largest_layers(budget, sharded):
    layers = 1
    while size_of(layers + 1, sharded).worker_bytes(BATCH // WORKERS) <= budget:
        layers += 1
    return layers


def model_function(layers):
    def build():
        import tf_keras

        model = tf_keras.Sequential([tf_keras.Input((INPUT,))]
                                    + [tf_keras.layers.Dense(WIDTH, activation="relu") for _ in range(layers)]
                                    + [tf_keras.layers.Dense(OUTPUTS)])
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-5),
                      loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    return build


def driver(name):
    """One contender's largest model and its fit, in a process of its own; prints a RESULT line."""
    import numpy as np
    import pandas as pd

    import tfbarrier
    from tfbarrier.errors import ModelError
    from tfbarrier.spark.worker_memory import executor_budget

    spark = harness.local_spark()
    rng = np.random.default_rng(0)
    rows = BATCH * STEPS
    frame = pd.DataFrame({"x": list(rng.random((rows, INPUT), dtype=np.float32)), "y": rng.integers(0, OUTPUTS, rows)})
    df = spark.createDataFrame(frame).repartition(WORKERS).cache()
    df.count()
    budget = executor_budget(spark, WORKERS)[0]
    sharded = CONTENDERS[name] is not None
    layers = largest_layers(budget, sharded)
    found = {"contender": name, "budget_mb": budget / 2**20, "refused": []}
    if sharded:  # what the check says of this model replicated
        replicated = size_of(layers, False)
        found["replicated_needs_mb"] = replicated.worker_bytes(BATCH // WORKERS) / 2**20
    for _ in range(TRIES):
        harness.settle()
        started = time.time()
        try:
            result = tfbarrier.fit(df, model_function(layers), features="x", label="y", batch_size=BATCH, epochs=1,
                                   num_workers=WORKERS, seed=0, communication=CONTENDERS[name], verbose=0)
        except ModelError as error:
            found["refused"].append({"layers": layers, "message": str(error)})
            layers -= 1
            continue
        chief = result.workers[0]
        losses = result.history.get("loss", [])
        found.update(layers=layers, parameters=parameters(layers),
                     estimate_mb=size_of(layers, sharded).worker_bytes(BATCH // WORKERS) / 2**20,
                     peaks_mb=[w["memory"]["peak_mb"] for w in result.workers],
                     process_estimates_mb=[w["memory"]["estimate_mb"] for w in result.workers],
                     seconds_a_step=chief["timings"]["training"] / chief["steps"], fit_seconds=time.time() - started,
                     loss_finite=bool(losses) and all(math.isfinite(v) for v in losses))
        break
    print("RESULT " + json.dumps(found), flush=True)
    spark.stop()


def section(found):
    base = found["replicated"]
    lines = [f"`.venv/bin/python bench/largest_model_bench.py`: deep MLPs of {WIDTH}-wide layers (16.8 M parameters "
             f"a layer), Adam, global batch {BATCH}, {STEPS} steps, {WORKERS} workers on local[2] at Spark's defaults, "
             "the memory check on; each contender's largest model the check accepts with what this machine had "
             "available when its driver started, built by a model function in the training processes.", "",
             "| contender | hidden layers | parameters | vs replicated | a worker's budget MB | the check's estimate MB "
             "| training processes' peaks MB | estimate / peak | s a step | loss finite | refused first |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, f in found.items():
        if "layers" not in f:
            lines.append(f"| {name} | - | - | - | {f['budget_mb']:,.0f} | - | - | - | - | - | "
                         f"{len(f['refused'])} refused |")
            continue
        lines.append(f"| {name} | {f['layers']} | {f['parameters'] / 1e6:,.0f} M | "
                     f"{f['parameters'] / base.get('parameters', float('nan')):.2f} | {f['budget_mb']:,.0f} | "
                     f"{f['estimate_mb']:,.0f} | {', '.join(f'{p:,.0f}' for p in f['peaks_mb'])} | "
                     f"{f['estimate_mb'] / max(f['peaks_mb']):.2f} | {f['seconds_a_step']:.1f} | {f['loss_finite']} | "
                     f"{len(f['refused'])} |")
    sharded = found["sharded"]
    if "replicated_needs_mb" in sharded:
        over = sharded["replicated_needs_mb"] > sharded["budget_mb"]
        lines += ["", f"The check of the sharded contender's first model replicated: each worker needs about "
                  f"{sharded['replicated_needs_mb']:,.0f} MB against its {sharded['budget_mb']:,.0f} MB "
                  f"({'refused' if over else 'accepted'})."]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        return driver(args.driver)
    found = {}
    for name in CONTENDERS:
        out = subprocess.run([sys.executable, __file__, "--driver", name], capture_output=True, text=True,
                             check=True).stdout
        found[name] = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
        print(name, found[name], flush=True)
    harness.write_section("largest-model", "### The largest Adam model 2 workers train, replicated and sharded\n\n"
                          + section(found))


if __name__ == "__main__":
    main()
