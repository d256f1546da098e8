"""Where a 2-worker step's time goes (issue 19): two MultiWorkerMirroredStrategy processes, no Spark,
the slides' CNN at 64 rows per worker on in-memory batches, one intra-op thread each (tfbarrier's
default on 2 cores), and worker 0's milliseconds per step for each part of a step, timed alone:

- compute: forward, backward and the optimizer's update, each worker on its own gradients (no
  collective), both workers at once;
- all-reduce: of one float (a collective's latency), and of the gradients alone (tensors of the
  gradients' shapes) with TensorFlow's default packing and with ``bytes_per_pack`` 64 MB (both send
  every gradient in one concatenated all-reduce: ``group_by_size`` packs all when it is 0);
- the whole step in a tf.function of our own (compute, all-reduce, update);
- Keras's ``fit`` on the same batches: steps_per_execution 1, 10 and 30, and with batch logs taken from
  the first replica (``distribute_reduction_method="first"``) rather than summed across workers (tf_keras's
  default); that without the accuracy metric, which every step reads across workers (tf_keras's
  ``result_wrapper``); and tfbarrier's own training function (pacing.py: metrics read once per call) at
  30 steps per call, as fit runs it, plain and with float16 gradients (exchange/strategy.py). Timed from the
  epoch's start to its end: ``fit`` returns seconds later, when its data iterator is deleted and waits
  for a tf.data background thread, which is not a step's cost;
- one process alone, no strategy, the same compute at 64 rows.

    .venv/bin/python bench/step_anatomy_bench.py [--model cnn|large] [--steps 200] [--rounds 3]
"""

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import harness  # noqa: E402

PACK = 64 * 2**20
BATCH = 64
PARTS = ("compute (each worker alone, no collective)", "all-reduce of one float (a collective's latency)",
         "all-reduce of the gradients (TensorFlow's default, bytes_per_pack=0: one concatenated all-reduce)",
         "all-reduce of the gradients, packed into one (bytes_per_pack=64 MB)",
         "whole step, tf.function of our own", "Keras fit, steps_per_execution=1 (tf_keras's default)",
         "Keras fit, steps_per_execution=1, batch logs from the first replica",
         "Keras fit, steps_per_execution=10", "Keras fit, steps_per_execution=30",
         "Keras fit, steps_per_execution=30, batch logs from the first replica",
         "... the same, compiled without metrics=[\"accuracy\"]",
         "tfbarrier's training function, 30 steps per call, batch logs from the first replica (fit's default)",
         "... the same, gradients all-reduced in float16 (communication={\"compression\": \"fp16\"})")


def per_step_ms(run, steps):
    """Milliseconds per step of ``run(steps)``, which returns a tensor to wait for, or the seconds it took."""
    run(5)  # traced and warm
    started = time.perf_counter()
    result = run(steps)
    if isinstance(result, float):
        return result * 1000 / steps
    if result is not None:
        result.numpy()
    return (time.perf_counter() - started) * 1000 / steps


def worker(kind, steps, rounds, out, parts):
    """One worker process: the ``parts`` (indices into PARTS), ``rounds`` times, in the same order as its
    peers."""
    import tensorflow as tf
    import tf_keras

    from workloads import build_model

    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model(tf_keras, kind)
    x, y = random_batch()
    runs = collective_parts(strategy, model, x, y) + keras_fit_parts(strategy, kind, x, y)
    chosen = {PARTS[i]: runs[i]() for i in parts}  # built in the same order on every worker
    times = {part: [] for part in chosen}
    for _ in range(rounds):
        for part, run in chosen.items():
            times[part].append(per_step_ms(run, steps))
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
        with open(out, "w") as f:
            json.dump(times, f)


def random_batch():
    """One batch of BATCH random images and labels, the same on every worker."""
    import numpy as np
    import tensorflow as tf

    from workloads import INPUT_SHAPE

    rng = np.random.default_rng(0)
    return (tf.constant(rng.random((BATCH, *INPUT_SHAPE), dtype=np.float32)),
            tf.constant(rng.integers(0, 10, BATCH)))


def collective_parts(strategy, model, x, y):
    """PARTS' first five, each a function that builds its run (a tf.function looping ``strategy.run``):
    compute alone, all-reduces of one float and of the gradients (default and packed), the whole step."""
    import tensorflow as tf
    import tf_keras

    packed = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=PACK)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    variables = model.trainable_variables

    def gradients():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(y, model(x, training=True))) / (2 * BATCH)
        return tape.gradient(loss, variables)

    def looped(step):
        @tf.function
        def run(n):
            for _ in tf.range(n):
                strategy.run(step)
        return lambda n: run(tf.constant(n))

    def compute():
        model.optimizer.apply_gradients(zip(gradients(), variables), skip_gradients_aggregation=True)

    def whole():
        model.optimizer.apply_gradients(zip(gradients(), variables))

    shapes = [tf.zeros_like(v) for v in variables]

    def all_reduce(options, tensors=shapes):
        def step():
            tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tensors, options=options)
        return step

    return [lambda: looped(compute), lambda: looped(all_reduce(None, [tf.zeros(())])),
            lambda: looped(all_reduce(None)), lambda: looped(all_reduce(packed)), lambda: looped(whole)]


def keras_fit_parts(strategy, kind, x, y):
    """PARTS' Keras fits, each a function that builds its run (see keras_fit)."""
    fit = functools.partial(keras_fit, strategy, kind, x, y)
    return [lambda: fit(1), lambda: fit(1, "first"), lambda: fit(10), lambda: fit(30), lambda: fit(30, "first"),
            lambda: fit(30, "first", metrics=False), lambda: fit(30, "first", tfbarrier=True),
            lambda: fit(30, "first", tfbarrier=True, compression="fp16")]


def keras_fit(strategy, kind, x, y, steps_per_execution, reduction="auto", metrics=True, tfbarrier=False,
              compression="none"):
    """A run of one Keras fit's epoch on a model of its own: the seconds from the epoch's start to its end."""
    import tensorflow as tf
    import tf_keras

    from tfbarrier.exchange import strategy_side as strategy_exchange
    from tfbarrier.fitting import pacing
    from workloads import build_model

    class EpochClock(tf_keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.began = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.began

    with strategy.scope():  # a model of its own: Keras fixes steps_per_execution when it first traces
        net = build_model(tf_keras, kind, 1 if tfbarrier else steps_per_execution)
        if not metrics:  # each step reads its metrics across workers (tf_keras's result_wrapper)
            net.compile(optimizer=net.optimizer, loss=net.loss, steps_per_execution=steps_per_execution)
    net.distribute_reduction_method = reduction
    if tfbarrier:  # what fit_job does: its own looping training function, and the gradients' compression
        strategy_exchange.compress_gradients(net, {"compression": compression})
        pacing.set_count(net, steps_per_execution)
    data = strategy.distribute_datasets_from_function(
        lambda _: tf.data.Dataset.from_tensors((x, y)).repeat())

    def run(n):
        clock = EpochClock()
        net.fit(data, epochs=1, steps_per_epoch=n, verbose=0, callbacks=[clock])
        return clock.seconds
    return run


def alone(kind, steps, rounds, out):
    """One process, no strategy: the compute of one worker's step when it has the machine to itself."""
    import tensorflow as tf
    import tf_keras

    from workloads import build_model

    tf.config.threading.set_intra_op_parallelism_threads(1)
    model = build_model(tf_keras, kind)
    x, y = random_batch()
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def run(n):
        for _ in tf.range(n):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            model.optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                                model.trainable_variables))
    times = [per_step_ms(lambda n: run(tf.constant(n)), steps) for _ in range(rounds)]
    with open(out, "w") as f:
        json.dump({"one process alone, compute at 64 rows (no strategy)": times}, f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(role, model, count, steps, rounds, parts=None):
    """Run ``count`` processes of ``role`` ("worker": MultiWorkerMirroredStrategy processes on loopback,
    timing ``parts``, indices into PARTS; "alone": one process without a strategy) and return worker 0's
    times: part -> milliseconds per step, one per round. bench/scaling_model.py runs it too."""
    out = tempfile.mktemp(prefix="tfbarrier-anatomy-", suffix=".json")
    parts = range(len(PARTS)) if parts is None else parts
    workers = [f"127.0.0.1:{free_port()}" for _ in range(count)]
    processes = []
    for index in range(count):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                                     "task": {"type": "worker", "index": index}}))
        processes.append(subprocess.Popen([sys.executable, __file__, "--as", role, "--model", model,
                                           "--steps", str(steps), "--rounds", str(rounds), "--out", out,
                                           "--parts", *map(str, parts)], env=env))
    try:
        for process in processes:
            if process.wait() != 0:
                raise SystemExit(f"a {role} process failed with exit code {process.returncode}")
        with open(out) as f:
            return json.load(f)
    finally:
        if os.path.exists(out):
            os.remove(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--as", dest="role", choices=("worker", "alone"))
    parser.add_argument("--model", choices=("cnn", "large"), default="cnn")
    parser.add_argument("--out")
    parser.add_argument("--parts", type=int, nargs="*", default=range(len(PARTS)), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        if args.role == "worker":
            worker(args.model, args.steps, args.rounds, args.out, args.parts)
        else:
            alone(args.model, args.steps, args.rounds, args.out)
        os._exit(0)  # skip interpreter teardown: TensorFlow's collective threads can stall it
    harness.local_spark_env()
    harness.settle()
    times = run_processes("alone", args.model, 1, args.steps, args.rounds)
    harness.settle()
    times.update(run_processes("worker", args.model, 2, args.steps, args.rounds))
    rows = ["| part of a step | min ms | median ms | max ms |", "|---|---|---|---|"]
    for part, values in times.items():
        rows.append(f"| {part} | {min(values):.1f} | {statistics.median(values):.1f} | {max(values):.1f} |")
    what = {"cnn": "the slides' CNN", "large": "the `large` model"}[args.model]
    body = (f"## Where a 2-worker step's time goes: {args.model}\n\n"
            f"`.venv/bin/python bench/step_anatomy_bench.py --model {args.model} --steps {args.steps} "
            f"--rounds {args.rounds}`: two MultiWorkerMirroredStrategy processes without Spark, {what} at 64 rows "
            "per worker on "
            "in-memory batches, one intra-op thread each; worker 0's milliseconds per step of each part timed "
            f"alone ({args.steps} steps in one tf.function, or one Keras fit's epoch), min / median / max over "
            f"{args.rounds} rounds. The first row is one process on its own.\n\n" + "\n".join(rows) + "\n")
    harness.write_section("anatomy" if args.model == "cnn" else f"anatomy-{args.model}", body)
    print(body)


if __name__ == "__main__":
    main()
