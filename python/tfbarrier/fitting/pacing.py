"""How many training steps each call from Python into TensorFlow runs: fit's ``steps_per_execution``.

Every call into a training function costs a few milliseconds of Python (Keras's loop, the callbacks)
during which, under MultiWorkerMirroredStrategy, the other workers wait at the next collective. On a
small model that is a large share of a step (bench/README.md, "Where a 2-worker step's time goes"), so
``steps_per_execution="auto"`` (fit's default) runs several steps per call: the first MEASURED_CALLS
calls after the traced first ones run one step each and are timed; then every worker takes the same
count, enough steps that a call lasts about TARGET_SECONDS (so progress heartbeats, the bar and the
stall watchdog still hear from a worker a few times a second), at most MAX_STEPS and at most an epoch.

The workers must agree: MultiWorkerMirroredStrategy gives each call its own collective instance key,
so workers that group their steps differently into calls wait forever for each other (over tfbarrier's
ring, the callbacks' exchanges would pair up wrongly). They exchange
their timings in one all-reduce, where each worker fills only its own slot (adding zeros is exact), and
all decide from the same numbers.
"""

import time
import weakref

import numpy as np
import tensorflow as tf
import tf_keras
from tf_keras.src.engine.training import reduce_per_replica

TARGET_SECONDS = 0.5  # how long one call should last
MAX_STEPS = 100  # beyond this a call saves nothing more (the per-call overhead is already amortized)
WARMUP_CALLS = 2  # the first calls trace the training function
MEASURED_CALLS = 8


def count_for(step_seconds, steps_per_epoch, most=MAX_STEPS):
    """The steps per call for the slowest worker's ``step_seconds`` (one step per call), at most ``most``."""
    return max(1, min(most, steps_per_epoch, int(TARGET_SECONDS / max(step_seconds, 1e-6))))


def resolve(model, steps_per_execution, most=MAX_STEPS, gather=None):
    """Set the model's steps per call before ``fit`` from fit's argument, and return the callback that
    tunes it ("auto" on a model compiled with Keras's default of 1; at most ``most`` steps per call: a
    checkpoint is saved at a call's end), else None. ``None`` keeps what the model was compiled with; a
    number fixes it. ``gather``: how the workers learn each other's timings (``everyones`` under the
    strategy; a fit over the ring passes its own)."""
    if steps_per_execution is None:
        return None
    if steps_per_execution != "auto":
        set_count(model, steps_per_execution)
        return None
    if int(model.steps_per_execution.numpy()) != 1:  # the user's own compile(steps_per_execution=n)
        return None
    return AutoStepsPerExecution(most, gather)


def set_count(model, count):
    """Run ``count`` steps per call from now on: in tfbarrier's looping training function where the
    model leaves its training step to Keras, else in Keras's own."""
    model.steps_per_execution = count
    if count > 1 and _keras_training_step(model):
        model.train_function = model.train_tf_function = looping_train_function(model)
    elif model.train_function is not None:
        model.make_train_function(force=True)


def _keras_training_step(model):
    """Whether a step's logs are Keras's: its metrics' results (no training step or function of the
    model's own, no XLA, not eager)."""
    own = [name for name in ("make_train_function", "train_step", "compute_metrics")
           if getattr(type(model), name) is not getattr(tf_keras.Model, name)]
    return not own and not model.jit_compile and not model.run_eagerly


def looping_train_function(model):
    """Keras's training function for several steps per call (tf_keras's ``make_train_function``),
    except that the metrics are read once, after a call's last step: fit reports a call's last logs
    and drops the others, and every read costs an all-reduce per metric across the workers (tf_keras's
    ``result_wrapper``). Each step still updates the metrics; the step is traced once, as in Keras."""
    strategy = model.distribute_strategy

    def run_step(data):
        object.__setattr__(model, "get_metrics_result", dict)  # while traced: no results (past Keras's tracking)
        try:
            model.train_step(data)
        finally:
            model.__dict__.pop("get_metrics_result", None)
        model._train_counter.assign_add(1)

    def train_function(iterator):
        # Read at run time, as Keras does: fit lowers it for an epoch's last, shorter call.
        for _ in tf.range(model._steps_per_execution):
            strategy.run(run_step, args=(next(iterator),))
        logs = strategy.run(model.get_metrics_result)
        return reduce_per_replica(logs, strategy, reduction=model.distribute_reduction_method)

    return tf.function(train_function, reduce_retracing=True)


_gatherers = weakref.WeakKeyDictionary()  # strategy -> its traced all-reduce for everyones()


def everyones(model, value):
    """Every replica's ``value`` (a number), the same list on each worker: one all-reduce, in which each
    replica fills only its own slot (see the module). Every worker must call it at the same point."""
    strategy = model.distribute_strategy
    if strategy not in _gatherers:
        replicas = strategy.num_replicas_in_sync

        def mine(value):
            context = tf.distribute.get_replica_context()
            slot = tf.one_hot(context.replica_id_in_sync_group, replicas, dtype=tf.float32) * value
            return context.all_reduce(tf.distribute.ReduceOp.SUM, slot)

        _gatherers[strategy] = tf.function(lambda value: strategy.run(mine, args=(value,)))
    everyone = _gatherers[strategy](tf.constant(value, tf.float32))
    return strategy.experimental_local_results(everyone)[0].numpy().tolist()


class AutoStepsPerExecution(tf_keras.callbacks.Callback):
    """Measures the first calls and sets the agreed count (see the module), at most ``most`` steps;
    ``gather(value)``: every worker's value (``everyones`` by default)."""

    def __init__(self, most=MAX_STEPS, gather=None):
        super().__init__()
        self.most, self.gather = most, gather
        self.calls, self.durations, self._last_end = 0, [], None
        self.decided = False

    def on_epoch_begin(self, epoch, logs=None):
        self._last_end = None  # a call is timed from the previous batch end of its own epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.decided:
            return
        now, self.calls = time.perf_counter(), self.calls + 1
        if self._last_end is not None and self.calls > WARMUP_CALLS:
            self.durations.append(now - self._last_end)  # the call, and every callback's batch hooks
        self._last_end = now
        if len(self.durations) == MEASURED_CALLS:  # at the same call on every worker
            mine = float(np.median(self.durations))
            slowest = max(self.gather(mine) if self.gather is not None else everyones(self.model, mine))
            count = count_for(slowest, self.params["steps"] or MAX_STEPS, self.most)
            if count > 1:
                # Keras built a one-step training function (the count was 1 as fit started); fit looks
                # its training function up on every call, so the looping one takes over here, traced
                # only by fits that run this long.
                set_count(self.model, count)
            self.decided = True
