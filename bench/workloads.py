"""The training every contender of bench/fit_bench.py and bench/scaling_bench.py runs: the same models,
data, batch sizes, step counts and tf.data pipeline, and one clock (a Keras callback that notes when
worker 0 finished its first step and each epoch, in wall-clock seconds comparable across processes).

Also the command line of the hand-started TensorFlow processes (contenders without Spark):

    python bench/workloads.py single --data DIR --model cnn --batch 128 --steps 100 --epochs 3 --clock F
    python bench/workloads.py worker --data DIR --model cnn --batch 64 --steps 100 --epochs 3 --clock F \
        (with TF_CONFIG set)
"""

import argparse
import json
import os
import time

import numpy as np

MODELS = ("cnn", "large", "mlp")
INPUT_SHAPE = (28, 28, 1)


def build_model(keras, kind, steps_per_execution=1):
    """The slides' CNN ("cnn"), a deeper one where compute per step dominates ("large"), or an MLP of 59 M
    parameters whose gradients dominate ("mlp": large_model_bench's 61 M shape on these 784 inputs), compiled
    with Adam; ``keras`` is Keras 3 (what a user hands tfbarrier) or tf_keras (what the peers train)."""
    layers = keras.layers
    if kind == "cnn":
        body = [layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(), layers.Flatten(),
                layers.Dense(64, activation="relu")]
    elif kind == "large":
        body = [layers.Conv2D(64, 3, activation="relu"), layers.Conv2D(64, 3, activation="relu"),
                layers.MaxPooling2D(), layers.Conv2D(128, 3, activation="relu"), layers.MaxPooling2D(),
                layers.Flatten(), layers.Dense(256, activation="relu")]
    elif kind == "mlp":
        body = [layers.Flatten(), layers.Dense(7310, activation="relu"), layers.Dense(7310, activation="relu")]
    else:
        raise ValueError(f"model must be one of {MODELS}, got {kind!r}")
    model = keras.Sequential([keras.Input(INPUT_SHAPE), *body, layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(0.001),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  steps_per_execution=steps_per_execution)
    return model


def make_data(directory, rows, seed=0):
    """Random 28x28 images and labels (the cost of a step does not depend on the values), saved as
    x.npy / y.npy for the contenders that read files; returned for the ones that build a DataFrame."""
    rng = np.random.default_rng(seed)
    x = rng.random((rows, 784), dtype=np.float32)
    y = rng.integers(0, 10, rows).astype(np.int64)
    np.save(os.path.join(directory, "x.npy"), x)
    np.save(os.path.join(directory, "y.npy"), y)
    return x, y


def step_clock(path):
    """A tf_keras callback that writes {"first_step_end", "epoch_ends"} (time.time()) to ``path`` when
    training ends, in worker 0 only (TF_CONFIG's index; no TF_CONFIG: a single process)."""
    import tf_keras

    class StepClock(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.first_step_end, self.epoch_ends = None, []

        def on_train_batch_end(self, batch, logs=None):
            if self.first_step_end is None:
                self.first_step_end = time.time()

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_ends.append(time.time())

        def on_train_end(self, logs=None):
            if worker_index() == 0:
                with open(path, "w") as f:
                    json.dump({"first_step_end": self.first_step_end, "epoch_ends": self.epoch_ends}, f)

    return StepClock()


def worker_index():
    config = os.environ.get("TF_CONFIG")
    return json.loads(config)["task"]["index"] if config else 0


def dataset(tf, x, y, batch, seed=0):
    """The pipeline tfbarrier's workers run on their shard: shuffle, repeat, batch, prefetch."""
    ds = tf.data.Dataset.from_tensor_slices((x.reshape((-1, *INPUT_SHAPE)), y))
    ds = ds.shuffle(min(len(x), 10_000), seed=seed).repeat().batch(batch, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def train_single(data, model, batch, steps, epochs, clock):
    """The limit: one TensorFlow process, no strategy, the whole data at the global batch."""
    import tensorflow as tf
    import tf_keras

    x, y = np.load(os.path.join(data, "x.npy")), np.load(os.path.join(data, "y.npy"))
    net = build_model(tf_keras, model)
    net.fit(dataset(tf, x, y, batch), epochs=epochs, steps_per_epoch=steps, verbose=0,
            callbacks=[step_clock(clock)])


def train_worker(data, model, batch, steps, epochs, clock, strategy=None):
    """One MultiWorkerMirroredStrategy worker (TF_CONFIG set by whoever started it) on its contiguous
    share of the rows, as tfbarrier's shards are; ``batch`` is the per-worker batch. Creates the
    strategy unless given one (spark-tensorflow-distributor creates it and calls this in its scope)."""
    import tensorflow as tf
    import tf_keras

    workers = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]
    index = worker_index()
    x, y = np.load(os.path.join(data, "x.npy")), np.load(os.path.join(data, "y.npy"))
    x, y = np.array_split(x, len(workers))[index], np.array_split(y, len(workers))[index]
    strategy = strategy or tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        net = build_model(tf_keras, model)
    global_batch = batch * len(workers)
    ds = strategy.distribute_datasets_from_function(
        lambda context: dataset(tf, x, y, context.get_per_replica_batch_size(global_batch), seed=index))
    net.fit(ds, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[step_clock(clock)])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("single", "worker"))
    for name in ("data", "model", "clock"):
        parser.add_argument(f"--{name}", required=True)
    for name in ("batch", "steps", "epochs"):
        parser.add_argument(f"--{name}", type=int, required=True)
    args = parser.parse_args()
    run = train_single if args.kind == "single" else train_worker
    run(args.data, args.model, args.batch, args.steps, args.epochs, args.clock)
    os._exit(0)  # skip interpreter teardown: TensorFlow's collective threads can stall it


if __name__ == "__main__":
    main()
