"""The training process's side of a fit over tfbarrier's ring, every fit of at most one GPU per worker by
default (communication implementation "auto" or "tfbarrier"; api._over_ring): a Keras 3 model that trains natively
(native_model.py), and a tf_keras model (a model object's, a model function's, a Keras 3 model translated).

No distribution strategy and no TensorFlow server: each worker trains its own copy of the model on its
shard, in the model's Keras, and two things cross the workers through exchange.Ring, which admits only
processes holding the job's secret:

- each step's gradients, summed and divided by the workers inside the compiled step, before the
  outermost optimizer applies them (Keras 3's ``optimizer.apply``, tf_keras's ``apply_gradients``), so
  every worker takes one process's step on the global batch and every weight and slot stays equal;
- each epoch's metric states (every Keras metric variable aggregates by sum), summed before Keras
  reads the epoch's results, so the history is the global batch's, as one process would log it.

tfbarrier's callbacks (progress, epoch log, validation, checkpoints) are tf_keras's kind, which Keras 3's
``fit`` takes too. Imported only in training processes.
"""

import contextlib
import functools
import math
import os
import sys
import time

import numpy as np
import tensorflow as tf
import tf_keras

from . import communication, evaluation, exchange, fit_training, memory, optimizers, pacing, settings, shards
from .checkpoints import resume_point, start_of
from .errors import WorkerError
from .model_spec import write_weights
from .results import FitOutput, ProcessReport
from .ring_checkpoints import RingCheckpoints, average_moving_statistics, fit_plan

TRAINED_ARCHIVE_FILE = "trained.keras"  # a Keras 3 chief's trained model, for the driver
COMMUNICATION = {"implementation": "tfbarrier ring (authenticated)"}


def train(job, config, channel):
    """Run ``job`` (a FitJob over the ring) with the task's ``config``: a ProcessReport."""
    index, workdir, steps_per_epoch = config["tf_config"]["task"]["index"], config["workdir"], config["steps_per_epoch"]
    shard = shards.Shard.open(config["shard"], config["rows"])
    started = time.time()
    ring = _join(job, config, index)
    try:
        flavor = Keras3() if getattr(job.model, "native", False) else TfKeras()
        model, memory_mb, sent = _model(job, workdir, ring, config, flavor)
        # unknown (a subclassed model): the rows' width, or each named input's (stored_forms.NamedRows)
        input_shape = flavor.input_shape(job, model) or (None if isinstance(shard.width, dict) else (shard.width,))
        job.layout.check_input(input_shape, shard.width)
        context = tf.distribute.InputContext(num_input_pipelines=ring.size, input_pipeline_id=index,
                                             num_replicas_in_sync=ring.size)
        resume = resume_point(job.checkpoint_dir)
        timings = {"strategy_and_model": time.time() - started}
        progress, epoch_log, saver, saves, callbacks = fit_training._callbacks(
            channel, job, workdir, index, resume=resume, batch_rows=job.batch_size // ring.size,
            steps_per_epoch=steps_per_epoch, keras=flavor.keras,
            checkpoints=functools.partial(RingCheckpoints, ring=ring), resumes_in_fit=flavor.keras is tf_keras)
        validation = fit_training._validation_data(job, None, config, input_shape, shard, context)
        if validation is not None:  # first: every later callback sees val_*
            callbacks.insert(0, flavor.validation(*validation, ring, every=job.validation_freq))
        # first: a call's logs global, the moving statistics (BatchNormalization's) averaged before validation;
        # last: a stop agreed
        callbacks = [GlobalBatchLogs(ring), AverageState(ring), *callbacks, StopTogether(ring)]
        started = time.time()
        try:
            _fits(job, model, flavor, shard, (input_shape, context, index, ring), resume, steps_per_epoch, callbacks,
                  saves)
        finally:
            progress.stop_keeping_alive()
        timings["training"] = time.time() - started
    finally:
        ring.close()
    if progress.first_step_at is not None:  # None when a resumed attempt had no epoch left to run
        timings["first_step"] = progress.first_step_at - started
    if saves is not None:
        timings["checkpoints"] = saves.save_seconds
    started = time.time()
    files, checksum = flavor.write_trained(job, model, workdir, index == 0)
    timings["trained_model_written"] = time.time() - started
    finished_at, (_, memory_mb["peak_mb"]) = time.time(), fit_training.resident_mb()
    output = FitOutput(
        steps=progress.steps, checksum=checksum, first_step_at=progress.first_step_at,
        memory=memory_mb, steps_per_execution=flavor.steps_per_execution(model), communication=sent,
        initial_epoch=epoch_log.initial_epoch or 0, checkpoint_saves=saves and saves.saves,
        resumed_at=resume and dict(zip(("epoch", "step"), start_of(resume, steps_per_epoch)),
                                   steps_done=resume["steps_done"]))
    if index == 0:
        fit_training._chiefs_output(output, job, epoch_log, saver)
    return ProcessReport(timings=timings, python_prefix=sys.prefix, finished_at=finished_at, output=output,
                         files=files)


class Keras3:
    """What a fit over the ring does its own way for a Keras 3 model (native_model.NativeModel)."""

    def __init__(self):
        import keras

        self.keras = keras
        self.validation = evaluation.Keras3Validation
        self.metrics_reader = "_get_metrics_result_or_logs"  # what Keras 3's fit reads an epoch's results with

    def seed(self, seed):
        self.keras.utils.set_random_seed(seed)

    def build(self, job, workdir):
        model = job.model.build(workdir)
        if not model.optimizer.built:  # its slots now, for a checkpoint to restore into
            model.optimizer.build(model.trainable_variables)
        optimizers.fuse_keras3_updates(model.optimizer)
        return model

    def input_shape(self, job, model):
        return job.model.input_shape

    def steps_per_execution(self, model):
        return int(model.steps_per_execution)

    def plan(self, resume, epochs, steps_per_epoch):
        return fit_plan(resume, epochs, steps_per_epoch)

    def pace(self, model, job, plan, ring):
        """Set the steps per call: Keras 3 runs whole calls, so they must divide every fit's epoch of the
        ``plan``, or an epoch would run past its end; fit's number, else as compiled ("auto" has no pacer
        here yet). The same on every worker: the ring's exchanges follow the calls. Returns None."""
        wanted = job.steps_per_execution if isinstance(job.steps_per_execution, int) else model.steps_per_execution
        steps = math.gcd(*[fit[2] for fit in plan])
        model.steps_per_execution = max(d for d in range(1, min(int(wanted), steps) + 1) if steps % d == 0)

    def wrap_apply(self, optimizer, mean_of):
        apply = optimizer.apply

        def apply_mean(grads, trainable_variables=None):
            return apply(mean_of(list(grads)), trainable_variables)

        optimizer.apply = apply_mean

    def write_trained(self, job, model, workdir, is_chief):
        """(the chief's ``.keras`` archive for the driver, the weights' checksum)."""
        if is_chief:
            model.save(os.path.join(workdir, TRAINED_ARCHIVE_FILE))
        return ({"archive": TRAINED_ARCHIVE_FILE} if is_chief else {}), write_weights(model.weights)


class TfKeras(Keras3):
    """The same for a tf_keras model (model_spec.ModelSpec: a tf_keras model, a model function's, a Keras 3
    model translated), rebuilt as under the strategy but outside any."""

    def __init__(self):
        self.keras = tf_keras
        self.validation = lambda dataset, steps, ring, every: evaluation.Validation(dataset, steps, every, ring)
        self.metrics_reader = "_validate_and_get_metrics_result"  # tf_keras's fit's, at an epoch's end

    def seed(self, seed):
        tf_keras.utils.set_random_seed(seed)

    def build(self, job, workdir):
        model = job.model.build(workdir)
        optimizers.build(model, None)
        optimizers.fuse_updates(model)
        return model

    def input_shape(self, job, model):
        return tuple(model.input_shape[1:])

    def steps_per_execution(self, model):
        return int(model.steps_per_execution.numpy())

    def plan(self, resume, epochs, steps_per_epoch):
        """One fit: tf_keras's starts mid-epoch itself (RingCheckpoints is its ``_training_state``), so the
        resumed epoch's steps keep their numbers, as under the strategy."""
        return [(0, epochs, steps_per_epoch, resume["steps_done"] if resume else 0)]

    def pace(self, model, job, plan, ring):
        """Set the steps per call as under the strategy (pacing.py: tf_keras cuts an epoch's last call
        short), the workers' timings gathered over the ring; the pacer for "auto", or None."""
        return pacing.resolve(model, job.steps_per_execution, most=fit_training._steps_between_checkpoints(job),
                              gather=lambda value: ring.all_gather(np.array(value, np.float64)).tolist())

    def wrap_apply(self, optimizer, mean_of):
        apply_gradients = optimizer.apply_gradients

        def apply_mean(grads_and_vars, *args, **kwargs):
            grads, variables = zip(*grads_and_vars)
            return apply_gradients(list(zip(mean_of(list(grads)), variables)), *args, **kwargs)

        optimizer.apply_gradients = apply_mean  # what minimize() calls, on this instance only

    def write_trained(self, job, model, workdir, is_chief):
        return fit_training._write_trained(job, model, workdir, is_chief)


def _join(job, config, index):
    """This worker's place in the ring of the job's training processes, made on the port it listened on."""
    try:
        return exchange.Ring.join(index, config["tf_config"]["cluster"]["worker"], job.secret.encode(),
                                  config["listener"], timeout=(job.communication or {}).get("timeout_seconds")
                                  or job.stall_timeout or settings.STALL_TIMEOUT, tls=job.tls)
    finally:
        config["listener"].close()  # the ring is made: from here on this process listens on no port


def _fits(job, model, flavor, shard, where, resume, steps_per_epoch, callbacks, saves):
    """This attempt's fits (ring_checkpoints.fit_plan), each on the shard's stream from the step it starts
    at. ``where``: (the model's input shape, the input context, this worker's index, the ring)."""
    input_shape, context, index, ring = where
    plan = flavor.plan(resume, job.epochs, steps_per_epoch)
    pacer = flavor.pace(model, job, plan, ring)
    if pacer is not None:
        callbacks = [pacer, *callbacks]
    for number, (initial_epoch, epochs, steps, first_step) in enumerate(plan):
        if saves is not None:
            saves.begin_fit(steps_per_epoch - steps, last=number == len(plan) - 1)
        dataset = shards.dataset_fn(shard, input_shape, job.batch_size, job.data_seed + index, job.shuffle,
                                    job.shuffle_buffer, job.class_weight,
                                    skip_rows=first_step * (job.batch_size // context.num_replicas_in_sync))(context)
        with _ring_losses_are_lost_contact():
            fit_training._fit(model, dataset, shard, input_shape, initial_epoch=initial_epoch, epochs=epochs,
                              steps_per_epoch=steps, callbacks=callbacks,
                              shuffle=False)  # the dataset shuffles (Keras 3 warns of its default otherwise)
        if model.stop_training and number < len(plan) - 1:  # a callback stopped it in the resumed epoch
            if saves is not None:
                saves.begin_fit(0, last=True)
                saves.on_train_end()
            break


@contextlib.contextmanager
def _ring_losses_are_lost_contact():
    """A peer lost in the ring (raised inside the compiled step, a TensorFlow error there) fails this process
    as TensorFlow's own lost contact with a peer does: a consequence, which the driver traces to its cause
    (faults.lost_contact)."""
    try:
        yield
    except (WorkerError, tf.errors.UnknownError) as exc:
        if exchange.LOST_PEER not in str(exc):
            raise
        raise tf.errors.UnavailableError(None, None, str(exc).split(exchange.LOST_PEER, 1)[1]) from exc


def _model(job, workdir, ring, config, flavor):
    """The user's model, compiled as they compiled it, its gradients and metrics crossing ``ring``;
    the memory checked once it is set up. Returns (model, {tensorflow_mb, baseline_mb}, how the gradients
    travel)."""
    if job.seed is not None:
        flavor.seed(job.seed)
    tensorflow_mb, _ = fit_training.resident_mb()
    model = flavor.build(job, workdir)
    if getattr(job.model, "flavor", None) == "function":  # built by each worker: with no seed, each its own weights
        ring.broadcast_variables(model.weights)  # (the strategy gave every variable worker 0's initial value)
    model.jit_compile = False  # the exchange is a Python call, which XLA cannot compile
    sent = exchange_gradients(model.optimizer, ring, job.communication, flavor)
    sum_metrics(model, ring, flavor.metrics_reader)
    baseline_mb, _ = fit_training.resident_mb()
    if job.memory_check:
        memory.check_on_host(memory.ModelSize.of(model, ring=True), job.batch_size // ring.size,
                             config["workers_on_host"], int((baseline_mb - tensorflow_mb) * 2**20))
    return model, {"tensorflow_mb": tensorflow_mb, "baseline_mb": baseline_mb}, sent


def exchange_gradients(optimizer, ring, options=None, flavor=None):
    """Make ``optimizer`` (of the ``flavor``'s Keras, Keras 3's by default) apply the mean of every worker's
    gradients. They cross ``ring`` from inside the compiled step in packs: consecutive gradients together up
    to ``bytes_per_pack`` (fit's ``communication``; 0: one pack), a larger one alone (no copy of it is made
    to join a pack), one pack after the other (the ring carries one exchange at a time, in the same order on
    every worker); in float16 with ``compression="fp16"``, as communication.py does under the strategy.
    Returns what FitResult.workers reports of it."""
    options = options or {}
    pack_bytes = options.get("bytes_per_pack", communication.PACK_BYTES) or float("inf")
    dtype = tf.float16 if options.get("compression") == "fp16" else tf.float32

    def mean(flat):
        total = ring.all_reduce_sum(flat)  # a copy: ``flat`` is TensorFlow's
        total /= ring.size
        return total

    def mean_of(grads):
        if ring.size > 1:
            after = []  # the ring's exchanges, one after the other
            sparse = [i for i, grad in enumerate(grads) if isinstance(grad, tf.IndexedSlices)]
            for i in sparse:
                grads[i], after = _gathered_slices(grads[i], ring, after)
            dense = [(i, grad) for i, grad in enumerate(grads) if grad is not None and i not in sparse]
            for pack in _packs(dense, pack_bytes):
                with tf.control_dependencies(after):
                    flat = tf.concat([tf.reshape(tf.cast(grad, dtype), [-1]) for _, grad in pack], 0)
                    summed = tf.numpy_function(mean, [flat], dtype, stateful=True)
                after = [summed]
                pieces = tf.split(summed, [grad.shape.num_elements() for _, grad in pack]) if len(pack) > 1 else [summed]
                for (i, grad), piece in zip(pack, pieces):
                    grads[i] = tf.cast(tf.reshape(piece, grad.shape), grad.dtype)
        return grads

    (flavor or Keras3()).wrap_apply(optimizer, mean_of)
    return {**COMMUNICATION, "bytes_per_pack": options.get("bytes_per_pack", communication.PACK_BYTES),
            "compression": options.get("compression", "none"), "encryption": ring.encryption or "none"}


def _gathered_slices(grad, ring, after):
    """A sparse gradient (an embedding's IndexedSlices: a row per lookup, the same count on every worker)
    as every worker's rows together, their values divided by the workers: what one process's gradient on
    the global batch holds, for Keras's sparse update (densified, Adam's would differ). Returns it and the
    exchange the next must follow."""
    def gather(values):
        return ring.all_gather(values).reshape(-1, *values.shape[1:])

    with tf.control_dependencies(after):
        values = tf.numpy_function(gather, [grad.values], grad.values.dtype, stateful=True)
    with tf.control_dependencies([values]):
        indices = tf.numpy_function(gather, [grad.indices], grad.indices.dtype, stateful=True)
    values = tf.reshape(values, [-1, *grad.values.shape[1:]]) / tf.cast(ring.size, grad.values.dtype)
    return tf.IndexedSlices(values, tf.reshape(indices, [-1]), grad.dense_shape), [indices]


def _packs(gradients, pack_bytes):
    """``gradients`` ((index, tensor) in order) in runs of at most ``pack_bytes`` of float32 (a larger one alone)."""
    packs, size = [], 0
    for index, grad in gradients:
        grad_bytes = 4 * grad.shape.num_elements()
        if not packs or size + grad_bytes > pack_bytes:
            packs.append([])
            size = 0
        packs[-1].append((index, grad))
        size += grad_bytes
    return packs


def sum_metrics(model, ring, reader):
    """Make the epoch's results (read by the model's method ``reader``) read every worker's metric states,
    summed (or averaged, for a variable that aggregates by mean), as one process holding every batch would
    have them."""
    results = getattr(model, reader)

    def global_results(logs):
        ring.sum_variables([v for metric in model.metrics for v in metric.variables])
        return results(logs)

    setattr(model, reader, global_results)


class GlobalBatchLogs(tf_keras.callbacks.Callback):
    """First of the callbacks: a call's logs (this worker's running loss and metrics) replaced by their mean
    across ``ring``. Every worker ran as many steps of as many rows, so the mean is the global batches'
    running value, what the strategy's logs hold: the progress bar and the user's batch-level callbacks see it."""

    def __init__(self, ring):
        super().__init__()
        self.ring = ring

    def on_train_batch_end(self, batch, logs=None):
        if not logs or self.ring.size == 1:
            return
        keys = sorted(key for key, value in logs.items() if np.ndim(value) == 0)
        means = self.ring.all_reduce_sum(np.array([float(logs[key]) for key in keys])) / self.ring.size
        logs.update(zip(keys, means.tolist()))


class AverageState(tf_keras.callbacks.Callback):
    """At each epoch's end, the moving statistics averaged across ``ring`` (average_moving_statistics): the
    model validated, saved and returned is one model."""

    def __init__(self, ring):
        super().__init__()
        self.ring = ring

    def on_epoch_end(self, epoch, logs=None):
        average_moving_statistics(self.ring, self.model)


class StopTogether(tf_keras.callbacks.Callback):
    """Last of the callbacks: when any worker's callbacks stopped the training (TerminateOnNaN on its own
    batch's loss, a time budget), every worker stops after the same call, so the ring stays in step."""

    def __init__(self, ring):
        super().__init__()
        self.ring = ring

    def _agree(self):
        if self.ring.all_reduce_sum(np.array([float(bool(self.model.stop_training))]))[0]:
            self.model.stop_training = True

    def on_train_batch_end(self, batch, logs=None):
        self._agree()

    def on_epoch_end(self, epoch, logs=None):
        self._agree()
