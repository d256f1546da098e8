"""The largest Adam model this machine's 2 workers train (issue 74), its optimizer's state replicated (the default)
and sharded over the ring (``communication={"shard": "optimizer"}``): deep MLPs of layers of 4096 (input 1024,
10 outputs; 16.8 M parameters, 64 MB of float32, a layer), whose weights are many layers, none over a few percent
of them: the models sharding is for (one of two large matrices sheds little: bench/README.md).

For each contender: the largest number of layers the memory check should accept with what this machine has
available before the driver builds the model (``worker_memory.executor_budget``, less half the driver's copy of
the weights for each worker; the model's size from its shapes), then, in a driver of its own, the model built (the
layers made with zeros, then each weight drawn in turn, so that the driver holds the weights once) and one fit:
Adam, global batch 64, STEPS steps, 2 workers on local[2] at Spark's defaults, the memory check on (the driver's,
with what the machine has then). A fit the check refuses is retried a layer smaller, in a new driver. Each
contender records the parameters, the budget, the check's estimate, each training process's peak, seconds a step,
whether the loss stayed finite, and the refusals before it.

    .venv/bin/python bench/largest_model_bench.py
"""

import argparse
import json
import math
import os
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import harness  # noqa: E402

harness.local_spark_env()

INPUT, WIDTH, OUTPUTS, BATCH, STEPS, WORKERS = 1024, 4096, 10, 64, 3, 2
CONTENDERS = {"replicated": None, "sharded": {"shard": "optimizer"}}  # name: communication
TRIES = 6  # drivers, a layer smaller each, where the driver's check refuses the model


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
    """The most layers whose workers fit ``budget`` each, once the driver holds the weights (half a worker's)."""
    layers = 1
    while size_of(layers + 1, sharded).worker_bytes(BATCH // WORKERS) <= budget - 2 * parameters(layers + 1):
        layers += 1
    return layers


def build(layers):
    """The deep MLP, its layers made with zeros and each weight then drawn in turn (a random initializer's
    temporaries, the weights twice over, would stay in the driver's TensorFlow allocator)."""
    import numpy as np
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((INPUT,))]
                                + [tf_keras.layers.Dense(WIDTH, activation="relu", kernel_initializer="zeros")
                                   for _ in range(layers)]
                                + [tf_keras.layers.Dense(OUTPUTS, kernel_initializer="zeros")])
    rng = np.random.default_rng(0)
    for variable in model.trainable_weights:
        if len(variable.shape) == 2:
            variable.assign(rng.standard_normal(variable.shape, dtype=np.float32) * np.sqrt(2 / variable.shape[0]))
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-5),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def driver(name, layers):
    """One fit of ``name``'s model of ``layers`` layers, in a process of its own; prints a RESULT line."""
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
    model = build(layers)
    sharded = CONTENDERS[name] is not None
    found = {"layers": layers, "parameters": parameters(layers), "budget_mb": executor_budget(spark, WORKERS)[0] / 2**20,
             "estimate_mb": size_of(layers, sharded).worker_bytes(BATCH // WORKERS) / 2**20}
    harness.settle()
    try:
        result = tfbarrier.fit(df, model, features="x", label="y", batch_size=BATCH, epochs=1, num_workers=WORKERS,
                               communication=CONTENDERS[name], verbose=0)
    except ModelError as error:
        found["refused"] = str(error)
    else:
        chief = result.workers[0]
        losses = result.history.get("loss", [])
        found.update(peaks_mb=[w["memory"]["peak_mb"] for w in result.workers],
                     seconds_a_step=chief["timings"]["training"] / chief["steps"],
                     loss_finite=bool(losses) and all(math.isfinite(v) for v in losses))
    print("RESULT " + json.dumps(found), flush=True)
    spark.stop()


def contender(name):
    """``name``'s largest model that the check accepts and its fit, trying a layer smaller after a refusal."""
    import tensorflow  # noqa: F401 - held by the driver too, as the Spark session is
    from tfbarrier.spark.worker_memory import executor_budget

    spark = harness.local_spark()
    budget = executor_budget(spark, WORKERS)[0]
    spark.stop()
    sharded = CONTENDERS[name] is not None
    layers, refused = largest_layers(budget, sharded), []
    for _ in range(TRIES):
        out = subprocess.run([sys.executable, __file__, "--driver", name, "--layers", str(layers)],
                             capture_output=True, text=True, check=True).stdout
        found = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
        if "refused" not in found:
            break
        refused.append(found)
        layers -= 1
    found["refused_first"] = refused
    if sharded:  # what the check says of this model replicated
        found["replicated_needs_mb"] = size_of(found["layers"], False).worker_bytes(BATCH // WORKERS) / 2**20
    return found


def section(found):
    base = found["replicated"]
    lines = [f"`.venv/bin/python bench/largest_model_bench.py`: deep MLPs of {WIDTH}-wide layers (16.8 M parameters "
             f"a layer), Adam, global batch {BATCH}, {STEPS} steps, {WORKERS} workers on local[2] at Spark's defaults, "
             "the memory check on; each contender's largest model the check accepts with what this machine had "
             "available (the model built on the driver, which holds its weights once).", "",
             "| contender | hidden layers | parameters | vs replicated | a worker's budget MB | the check's estimate MB "
             "| training processes' peaks MB | estimate / peak | s a step | loss finite | refused first |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, f in found.items():
        refusals = "; ".join(f"{r['layers']} layers" for r in f["refused_first"]) or "-"
        if "refused" in f:
            lines.append(f"| {name} | {f['layers']} (refused) | - | - | {f['budget_mb']:,.0f} | {f['estimate_mb']:,.0f} "
                         f"| - | - | - | - | {refusals} |")
            continue
        lines.append(f"| {name} | {f['layers']} | {f['parameters'] / 1e6:,.0f} M | "
                     f"{f['parameters'] / base['parameters']:.2f} | {f['budget_mb']:,.0f} | "
                     f"{f['estimate_mb']:,.0f} | {', '.join(f'{p:,.0f}' for p in f['peaks_mb'])} | "
                     f"{f['estimate_mb'] / max(f['peaks_mb']):.2f} | {f['seconds_a_step']:.1f} | {f['loss_finite']} | "
                     f"{refusals} |")
    sharded = found["sharded"]
    over = sharded["replicated_needs_mb"] > sharded["budget_mb"]
    lines += ["", f"The check of the sharded contender's model replicated: each worker needs about "
              f"{sharded['replicated_needs_mb']:,.0f} MB against the {sharded['budget_mb']:,.0f} MB it had "
              f"({'refused' if over else 'accepted'})."]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        return driver(args.driver, args.layers)
    found = {}
    for name in CONTENDERS:
        found[name] = contender(name)
        print(name, found[name], flush=True)
    harness.write_section("largest-model", "### The largest Adam model 2 workers train, replicated and sharded\n\n"
                          + section(found))


if __name__ == "__main__":
    main()
