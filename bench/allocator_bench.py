"""What TensorFlow's CPU allocator keeps: a large model's training step under oneDNN's pool (the
default) and under the system allocator (TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1), side by side.

Two processes on 127.0.0.1 train the 61 M-parameter MLP of large_model_bench.py under
MultiWorkerMirroredStrategy as a training process does (zero initializers, each worker's own, tfbarrier's optimizer and
gradient pieces: fitting/optimizers.py, exchange/strategy.py), 12 steps of 32 rows each, without Spark. Worker 0
reports its peak resident memory above its baseline (after TensorFlow and the strategy, before the
model) and the seconds per step after the second. The table is the median (min-max) of the rounds.

    .venv/bin/python bench/allocator_bench.py [--rounds 3]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import harness

BENCH = os.path.dirname(os.path.abspath(__file__))
ALLOCATORS = {"oneDNN's pool (default)": {}, "system allocator": {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"}}
HIDDEN, INPUT, OUTPUTS, ROWS, STEPS = 7310, 1024, 10, 64, 12


def peak_mb():
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return int(status["VmHWM"].split()[0]) / 1024


def worker(index, ports, out):
    """One worker of the 2-worker job: what a training process does for the MLP, then the figures."""
    os.environ.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
        {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": index}}))
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from tfbarrier.exchange import strategy_side as strategy_exchange
    from tfbarrier import keras_helpers
    from tfbarrier.fitting import optimizers

    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=strategy_exchange.strategy_options(tf, None))
    baseline = peak_mb()
    with strategy.scope():
        with keras_helpers.initial_values_local(strategy):  # as ModelSpec.build: no broadcast of the weights
            layers = tf_keras.layers
            model = tf_keras.Sequential([
                tf_keras.Input((INPUT,)), layers.Dense(HIDDEN, "relu", kernel_initializer="zeros"),
                layers.Dense(HIDDEN, "relu", kernel_initializer="zeros"), layers.Dense(OUTPUTS, kernel_initializer="zeros")])
            model.compile(optimizer=tf_keras.optimizers.SGD(0.01),
                          loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        optimizers.build(model, strategy)
        optimizers.fuse_updates(model)
        strategy_exchange.all_reduce_in_pieces(model, None)
    rng = np.random.default_rng(0)
    x, y = rng.random((256, INPUT), dtype=np.float32), rng.integers(0, OUTPUTS, 256)
    ends = []
    step_ends = tf_keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter()))
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(ROWS), steps_per_epoch=STEPS, verbose=0,
              callbacks=[step_ends])
    if index == 0:
        with open(out, "w") as f:
            json.dump({"growth_mb": peak_mb() - baseline, "step_seconds": (ends[-1] - ends[1]) / (len(ends) - 2)}, f)


def run(env):
    out, ports = tempfile.mktemp(suffix=".json"), harness.free_ports(2)
    python_path = os.pathsep.join([os.path.join(BENCH, "..", "python"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=python_path, **env)
    workers = [subprocess.Popen([sys.executable, __file__, "worker", str(i), *map(str, ports), out], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    if any(w.wait() for w in workers):
        raise RuntimeError("a worker failed")
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", nargs="?", default="bench", choices=("bench", "worker"))
    parser.add_argument("args", nargs="*")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.kind == "worker":
        index, port_0, port_1, out = args.args
        return worker(int(index), [int(port_0), int(port_1)], out)
    results = harness.rounds_of({name: (lambda env=env: (harness.settle(), run(env))[1])
                                 for name, env in ALLOCATORS.items()}, args.rounds, log=print)
    default = [r["step_seconds"] for r in results["oneDNN's pool (default)"]]
    lines = ["## What TensorFlow's CPU allocator keeps", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             "| allocator | peak growth MB | s per step | step time / default |", "|---|---|---|---|"]
    for name, runs in results.items():
        growth, seconds = [r["growth_mb"] for r in runs], [r["step_seconds"] for r in runs]
        lo, mid, hi = harness.stats(growth)
        slo, smid, shi = harness.stats(seconds)
        lines.append(f"| {name} | {mid:,.0f} ({lo:,.0f}-{hi:,.0f}) | {smid:.2f} ({slo:.2f}-{shi:.2f}) | "
                     f"{smid / harness.stats(default)[1]:.2f} |")
    lines += ["", f"`.venv/bin/python bench/allocator_bench.py --rounds {args.rounds}`"]
    harness.write_section("allocator", "\n".join(lines))


if __name__ == "__main__":
    main()
