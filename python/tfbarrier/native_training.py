"""The training process's side of a fit of a Keras 3 model that trains natively (native_model.py).

No distribution strategy and no TensorFlow server (Keras 3 cannot fit under MultiWorkerMirroredStrategy,
keras-team/keras#20585): each worker trains its own copy of the model on its shard, in Keras 3, and
two things cross the workers through exchange.Ring, which admits only processes holding the job's
secret:

- each step's gradients, summed and divided by the workers inside the compiled step, before the
  outermost optimizer applies them (``optimizer.apply``: ``apply_gradients`` calls it too), so every
  worker takes one process's step on the global batch and every weight and slot stays equal;
- each epoch's metric states (every Keras metric variable aggregates by sum), summed before Keras
  reads the epoch's results, so the history is the global batch's, as one process would log it.

tfbarrier's callbacks (progress, epoch log) are fit_training's, and the user's are Keras 3's.
Imported only in training processes.
"""

import contextlib
import functools
import math
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from . import communication, exchange, fit_training, memory, optimizers, settings, shards
from .checkpoints import resume_point, start_of
from .errors import WorkerError
from .native_checkpoints import NativeCheckpoints, fit_plan
from .model_spec import write_weights
from .results import FitOutput, ProcessReport

TRAINED_ARCHIVE_FILE = "trained.keras"  # the chief's trained model, for the driver
COMMUNICATION = {"implementation": "tfbarrier ring (authenticated)"}


def train(job, config, channel):
    """Run ``job`` (a FitJob of a native model) with the task's ``config``: a ProcessReport."""
    index, workdir, steps_per_epoch = config["tf_config"]["task"]["index"], config["workdir"], config["steps_per_epoch"]
    shard = shards.Shard.open(config["shard"], config["rows"])
    started = time.time()
    ring = _join(job, config, index)
    try:
        model, memory_mb, sent = _model(job, workdir, ring, config)
        # unknown (a subclassed model): the rows' width, or each named input's (stored_forms.NamedRows)
        input_shape = job.model.input_shape or (None if isinstance(shard.width, dict) else (shard.width,))
        job.layout.check_input(input_shape, shard.width)
        context = tf.distribute.InputContext(num_input_pipelines=ring.size, input_pipeline_id=index,
                                             num_replicas_in_sync=ring.size)
        resume = resume_point(job.checkpoint_dir)
        timings = {"strategy_and_model": time.time() - started}
        progress, epoch_log, saver, saves, callbacks = fit_training._callbacks(
            channel, job, workdir, index, resume=resume, batch_rows=job.batch_size // ring.size,
            steps_per_epoch=steps_per_epoch, keras=keras, checkpoints=functools.partial(NativeCheckpoints, ring=ring))
        validation = fit_training._validation_data(job, None, config, input_shape, shard, context)
        if validation is not None:  # first: every later callback sees val_*
            callbacks.insert(0, Validation(*validation, ring, every=job.validation_freq))
        # before validation: the moving statistics (BatchNormalization's) averaged; last: a stop agreed
        callbacks = [AverageState(ring), *callbacks, StopTogether(ring)]
        started = time.time()
        try:
            _fits(job, model, shard, (input_shape, context, index), resume, steps_per_epoch, callbacks, saves)
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
    files = _write_trained(model, workdir, index == 0)
    timings["trained_model_written"] = time.time() - started
    finished_at, (_, memory_mb["peak_mb"]) = time.time(), fit_training.resident_mb()
    output = FitOutput(
        steps=progress.steps, checksum=write_weights(model.weights), first_step_at=progress.first_step_at,
        memory=memory_mb, steps_per_execution=int(model.steps_per_execution), communication=sent,
        initial_epoch=epoch_log.initial_epoch or 0, checkpoint_saves=saves and saves.saves,
        resumed_at=resume and dict(zip(("epoch", "step"), start_of(resume, steps_per_epoch)),
                                   steps_done=resume["steps_done"]))
    if index == 0:
        fit_training._chiefs_output(output, job, epoch_log, saver)
    return ProcessReport(timings=timings, python_prefix=sys.prefix, finished_at=finished_at, output=output,
                         files=files)


def _join(job, config, index):
    """This worker's place in the ring of the job's training processes, made on the port it listened on."""
    try:
        return exchange.Ring.join(index, config["tf_config"]["cluster"]["worker"], job.secret.encode(),
                                  config["listener"], timeout=(job.communication or {}).get("timeout_seconds")
                                  or job.stall_timeout or settings.STALL_TIMEOUT, tls=job.tls)
    finally:
        config["listener"].close()  # the ring is made: from here on this process listens on no port


def _fits(job, model, shard, where, resume, steps_per_epoch, callbacks, saves):
    """This attempt's Keras 3 fits (native_checkpoints.fit_plan), each on the shard's stream from the step it
    starts at. ``where``: (the model's input shape, the input context, this worker's index)."""
    input_shape, context, index = where
    plan = fit_plan(resume, job.epochs, steps_per_epoch)
    # Keras 3 runs whole calls: steps per call must divide every fit's epoch, or an epoch would run past its end
    wanted = job.steps_per_execution if isinstance(job.steps_per_execution, int) else model.steps_per_execution
    steps = math.gcd(*[fit[2] for fit in plan])
    model.steps_per_execution = max(d for d in range(1, min(int(wanted), steps) + 1) if steps % d == 0)
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


def _model(job, workdir, ring, config):
    """The user's model, compiled as they compiled it, its gradients and metrics crossing ``ring``;
    the memory checked once it is set up. Returns (model, {tensorflow_mb, baseline_mb}, how the gradients
    travel)."""
    if job.seed is not None:
        keras.utils.set_random_seed(job.seed)
    tensorflow_mb, _ = fit_training.resident_mb()
    model = job.model.build(workdir)
    if not model.optimizer.built:  # its slots now, for a checkpoint to restore into
        model.optimizer.build(model.trainable_variables)
    model.jit_compile = False  # the exchange is a Python call, which XLA cannot compile
    optimizers.fuse_keras3_updates(model.optimizer)
    sent = exchange_gradients(model.optimizer, ring, job.communication)
    sum_metrics(model, ring)
    baseline_mb, _ = fit_training.resident_mb()
    if job.memory_check:
        memory.check_on_host(memory.ModelSize.of(model), job.batch_size // ring.size, config["workers_on_host"],
                             int((baseline_mb - tensorflow_mb) * 2**20))
    return model, {"tensorflow_mb": tensorflow_mb, "baseline_mb": baseline_mb}, sent


def exchange_gradients(optimizer, ring, options=None):
    """Make ``optimizer`` apply the mean of every worker's gradients. They cross ``ring`` from inside the
    compiled step in packs: consecutive gradients together up to ``bytes_per_pack`` (fit's
    ``communication``; 0: one pack), a larger one alone (no copy of it is made to join a pack), one pack
    after the other (the ring carries one exchange at a time, in the same order on every worker); in
    float16 with ``compression="fp16"``, as communication.py does under the strategy. Returns what
    FitResult.workers reports of it."""
    apply = optimizer.apply
    options = options or {}
    pack_bytes = options.get("bytes_per_pack", communication.PACK_BYTES) or float("inf")
    dtype = tf.float16 if options.get("compression") == "fp16" else tf.float32

    def mean(flat):
        total = ring.all_reduce_sum(flat)  # a copy: ``flat`` is TensorFlow's
        total /= ring.size
        return total

    def apply_mean(grads, trainable_variables=None):
        grads = list(grads)
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
        return apply(grads, trainable_variables)

    optimizer.apply = apply_mean
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


def sum_metrics(model, ring):
    """Make the epoch's results read every worker's metric states, summed (or averaged, for a
    variable that aggregates by mean), as one process holding every batch would have them."""
    results = model._get_metrics_result_or_logs

    def global_results(logs):
        _sum_variables([v for metric in model.metrics for v in metric.variables], ring)
        return results(logs)

    model._get_metrics_result_or_logs = global_results


def _sum_variables(variables, ring, mean=False):
    """Replace each Keras variable that aggregates by sum (every metric's state) by its sum across
    ``ring``, one that aggregates by mean (or every one, with ``mean``) by its mean: one exchange for them all."""
    if not mean:
        variables = [v for v in variables if getattr(v, "aggregation", "sum") in ("sum", "mean")]
    if ring.size == 1 or not variables:
        return
    values = [np.asarray(v.numpy(), np.float64) for v in variables]
    total = ring.all_reduce_sum(np.concatenate([value.reshape(-1) for value in values]))
    at = 0
    for variable, value in zip(variables, values):
        summed = total[at:at + value.size].reshape(value.shape)
        at += value.size
        if mean or variable.aggregation == "mean":
            summed = summed / ring.size
        variable.assign(summed.astype(np.dtype(variable.dtype)))


class AverageState(keras.callbacks.Callback):
    """At each epoch's end, every worker's non-trainable float weights (BatchNormalization's moving mean
    and variance, which each worker updates from its own rows) replaced by their mean across ``ring``: the
    model validated, saved and returned is one model, as the translated path reads such weights averaged."""

    def __init__(self, ring):
        super().__init__()
        self.ring = ring

    def on_epoch_end(self, epoch, logs=None):
        state = [v for v in self.model.non_trainable_variables if "float" in str(v.dtype)]
        if state:
            _sum_variables(state, self.ring, mean=True)


class StopTogether(keras.callbacks.Callback):
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


class Validation(keras.callbacks.Callback):
    """``val_loss`` and ``val_<metric>`` in every ``every``-th epoch's logs, from ``steps`` steps over
    ``dataset`` ((x, y, present, sample weight) batches, present 0 for padding rows), summed across
    ``ring``: every validation row counts once, as in one process's ``model.evaluate`` (evaluation.py
    does the same under the strategy)."""

    def __init__(self, dataset, steps, ring, every=1):
        super().__init__()
        self.dataset, self.steps, self.ring, self.every = dataset, steps, ring, every

    def on_train_begin(self, logs=None):
        model = self.model

        @tf.function
        def step(x, y, present, weight):
            predicted = model(x, training=False)
            real = present > 0  # the compiled metrics= ignore sample weights: the padding rows are left out
            if model._compile_metrics is not None:
                kept = functools.partial(tf.nest.map_structure, lambda t: tf.boolean_mask(t, real))
                model._compile_metrics.update_state(kept(y), kept(predicted), kept(weight))
            # Keras's compiled loss (each output's, times its loss weight) is a sum over the batch's rows, their
            # weights applied, divided by the rows: times the rows, the sum, which padding rows (weight 0) leave
            rows = tf.cast(tf.shape(present)[0], tf.float32)
            total = tf.cast(model._compile_loss(y, predicted, sample_weight=weight * present), tf.float32) * rows
            return total, tf.reduce_sum(present)

        self._step = step

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or (epoch + 1) % self.every:
            return
        metrics = self.model._compile_metrics
        # each output's loss (a model of several): Keras's Means of the batches' losses, padding rows counted
        per_output = self.model._compile_loss.metrics if self.model._compile_loss is not None else []
        for metric in [metrics, *per_output]:
            if metric is not None:
                metric.reset_state()
        total = np.zeros(2)
        for batch in self.dataset.take(self.steps):
            total += [float(value) for value in self._step(*batch)]
        total = self.ring.all_reduce_sum(np.array([*total, *(float(each.total) for each in per_output)]))
        regularization = float(sum(float(loss) for loss in self.model.losses))
        logs["val_loss"] = total[0] / total[1] + regularization
        # their sums (the rows' losses times the rows of each batch) over the rows that are not padding
        logs.update({f"val_{each.name}": value / total[1] for each, value in zip(per_output, total[2:])})
        if metrics is not None:  # read across workers: every worker sums them in this order
            _sum_variables(metrics.variables, self.ring)
            logs.update({f"val_{name}": float(value) for name, value in metrics.result().items()})


def _write_trained(model, workdir, is_chief):
    """The chief's trained model as a ``.keras`` archive, for the driver."""
    if not is_chief:
        return {}
    model.save(os.path.join(workdir, TRAINED_ARCHIVE_FILE))
    return {"archive": TRAINED_ARCHIVE_FILE}
