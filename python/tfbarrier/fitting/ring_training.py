"""The training process's side of the "tfbarrier" exchange (authenticated_ring.py): a fit over tfbarrier's
ring, every fit of at most one GPU per worker by default; a Keras 3 model that trains natively
(models/native_model.py), and a tf_keras model (a model object's, a model function's, a Keras 3 model
translated).

No distribution strategy and no TensorFlow server: each worker trains its own copy of the model on its
shard, in the model's Keras, on fitting/training.py's toolkit, and two things cross the workers through
ring.Ring, which admits only processes holding the job's secret:

- each step's gradients, summed and divided by the workers inside the compiled step, before the
  outermost optimizer applies them (Keras 3's ``optimizer.apply``, tf_keras's ``apply_gradients``), so
  every worker takes one process's step on the global batch and every weight and slot stays equal;
- each epoch's metric states (every Keras metric variable aggregates by sum), summed before Keras
  reads the epoch's results, so the history is the global batch's, as one process would log it.

tfbarrier's callbacks (progress, epoch log, validation, checkpoints) are tf_keras's kind, which Keras 3's
``fit`` takes too. Imported only in training processes.
"""

import contextlib
import dataclasses
import functools
import math
import os
import sys
import time

import numpy as np
import tensorflow as tf
import tf_keras

from tfbarrier import settings
from tfbarrier.data import shards, text
from tfbarrier.errors import ModelError
from tfbarrier.exchange.ring import Ring
from tfbarrier.exchange.ring_hooks import (AverageState, ExchangedOnly, GlobalBatchLogs, StopTogether,
                                           exchange_gradients, sum_metrics)
from tfbarrier.fitting import evaluation, optimizers, pacing, training
from tfbarrier.fitting.checkpoints import resume_point, start_of
from tfbarrier.fitting.ring_checkpoints import RingCheckpoints, fit_plan
from tfbarrier.models import memory
from tfbarrier.models.model_spec import keras_flavor
from tfbarrier.models.weights_file import write_weights
from tfbarrier.models.native_model import input_shape_of
from tfbarrier.results import FitOutput, ProcessReport

TRAINED_ARCHIVE_FILE = "trained.keras"  # a Keras 3 chief's trained model, for the driver


def train(job, config, channel):
    """Run ``job`` (a FitJob over the ring) with the task's ``config``: a ProcessReport."""
    index, workdir, steps_per_epoch = config["tf_config"]["task"]["index"], config["workdir"], config["steps_per_epoch"]
    shard = shards.Shard.open(config["shard"], config["rows"])
    started = time.time()
    ring = _join(job, config, index)
    try:
        exchanged = set()
        model, flavor, memory_mb, sent = _model(job, workdir, ring, config, exchanged, shard.width)
        # unknown (a subclassed model): the rows' width, or each named input's (stored_forms.NamedRows)
        input_shape = flavor.input_shape(job, model) or (None if isinstance(shard.width, dict) else (shard.width,))
        job.layout.check_input(input_shape, shard.width)
        context = tf.distribute.InputContext(num_input_pipelines=ring.size, input_pipeline_id=index,
                                             num_replicas_in_sync=ring.size)
        resume = resume_point(job.checkpoint_dir)
        timings = {"strategy_and_model": time.time() - started}
        progress, epoch_log, saver, saves, callbacks = training.make_callbacks(
            channel, job, workdir, index, resume=resume, batch_rows=job.batch_size // ring.size,
            steps_per_epoch=steps_per_epoch, keras=flavor.keras,
            checkpoints=functools.partial(RingCheckpoints, ring=ring), resumes_in_fit=flavor.keras is tf_keras)
        shard = _preprocessed(job, model, shard, saver)
        validation = training.validation_dataset(job, None, config, input_shape, shard, context)
        callbacks = _with_the_rings(callbacks, ring, exchanged, validation and flavor.validation(
            *validation, ring, every=job.validation_freq))
        started = time.time()
        try:
            _fits(job, model, flavor, shard, (input_shape, context, index, ring), resume, steps_per_epoch, callbacks,
                  saves)
        finally:
            progress.stop_keeping_alive()
        timings["training"] = time.time() - started
    finally:
        ring.close()
    if saves is not None:
        timings["checkpoints"] = saves.save_seconds
    model = _whole(model, shard)
    files, checksum, finished_at = training.wrap_up(progress, started, timings, memory_mb,
                                                    lambda: flavor.write_trained(job, model, workdir, index == 0))
    output = FitOutput(
        steps=progress.steps, checksum=checksum, first_step_at=progress.first_step_at, memory=memory_mb,
        steps_per_execution=flavor.steps_per_execution(model), communication=dict(sent, bytes_sent=ring.bytes_sent),
        initial_epoch=epoch_log.initial_epoch or 0, checkpoint_saves=saves and saves.saves,
        resumed_at=resume and dict(zip(("epoch", "step"), start_of(resume, steps_per_epoch)),
                                   steps_done=resume["steps_done"]))
    if index == 0:
        training.chiefs_output(output, job, epoch_log, saver)
    return ProcessReport(timings=timings, python_prefix=sys.prefix, finished_at=finished_at, output=output,
                         files=files)


def _with_the_rings(callbacks, ring, exchanged, validation):
    """The fit's ``callbacks`` among the ring's: first, a call's logs made global and the moving statistics
    (BatchNormalization's) averaged before ``validation`` (a callback, or None), which every later callback
    sees the val_* of; last, a stop agreed."""
    callbacks = [validation, *callbacks] if validation is not None else callbacks
    return [GlobalBatchLogs(ring), ExchangedOnly(ring, exchanged), AverageState(ring), *callbacks,
            StopTogether(ring, callbacks)]


class Keras3:
    """What a fit over the ring does its own way for a Keras 3 model (native_model.NativeModel)."""

    def __init__(self):
        import keras

        self.keras = keras
        self.validation = evaluation.Keras3Validation
        self.metrics_reader = "_get_metrics_result_or_logs"  # what Keras 3's fit reads an epoch's results with

    def prepared(self, model):
        """``model`` (built by its spec) ready to train: its optimizer's slots made, its updates fused."""
        if not model.optimizer.built:  # its slots now, for a checkpoint to restore into
            model.optimizer.build(model.trainable_variables)
        optimizers.fuse_keras3_updates(model.optimizer)
        return model

    def input_shape(self, job, model):
        return job.model.input_shape if job.model.input_shape is not None else input_shape_of(model)

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

        def apply_mean(grads, trainable_variables=None):  # None: every variable the optimizer updates
            return apply(mean_of(list(grads), trainable_variables), trainable_variables)

        optimizer.apply = apply_mean

    def write_trained(self, job, model, workdir, is_chief):
        """(the chief's ``.keras`` archive for the driver, the weights' checksum); with adapters, which no
        archive keeps, its weights file."""
        if hasattr(job.model, "write_trained"):  # a preset's: its adapters alone, where it has them
            return (job.model.write_trained(model, workdir) if is_chief else {}), write_weights(model.weights)
        if getattr(job.model, "adapters", ()):
            return training.write_trained(job, model, workdir, is_chief)
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

    def prepared(self, model):
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
        return pacing.resolve(model, job.steps_per_execution, most=training.steps_between_checkpoints(job),
                              gather=lambda value: ring.all_gather(np.array(value, np.float64)).tolist())

    def wrap_apply(self, optimizer, mean_of):
        apply_gradients = optimizer.apply_gradients

        def apply_mean(grads_and_vars, *args, **kwargs):
            grads, variables = zip(*grads_and_vars)
            return apply_gradients(list(zip(mean_of(list(grads), variables), variables)), *args, **kwargs)

        optimizer.apply_gradients = apply_mean  # what minimize() calls, on this instance only

    def write_trained(self, job, model, workdir, is_chief):
        return training.write_trained(job, model, workdir, is_chief)


def _seed(seed, keras3):
    """Seed both Keras before the model is built (Keras 3's with ``keras3``: the model may be its; seeded last, its
    seeds of Python, NumPy and TensorFlow are the ones left)."""
    tf_keras.utils.set_random_seed(seed)
    if keras3:
        import keras

        keras.utils.set_random_seed(seed)


def _preprocessed(job, model, shard, saver):
    """For a text fit, the shard whose batches the model's preprocessor makes, taken off the model (fit must not
    run it again) and put back by the saver for each save; else the shard."""
    if not job.layout.takes_text:
        return shard
    preprocessing = text.Preprocessing(text.take_off(model), labelled=job.layout.label is not None)
    if preprocessing.preprocessor is None:  # a preset the driver could not look into (a handle)
        raise ModelError(f"the feature column {job.layout.features[0]!r} holds strings, but the model has no "
                         "preprocessor to tokenize them: save the task with its preprocessor, or tokenize the column")
    if saver is not None:
        saver.preprocessor = preprocessing.preprocessor
    return dataclasses.replace(shard, text=preprocessing)


def _whole(model, shard):
    """The model as the user gave it: with the preprocessor its text batches were made by, when it has one."""
    return model if shard.text is None else text.put_back(model, shard.text.preprocessor)


def _join(job, config, index):
    """This worker's place in the ring of the job's training processes, made on the port it listened on."""
    try:
        return Ring.join(index, config["tf_config"]["cluster"]["worker"], job.secret.encode(),
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
        with _the_rings_own_failure(ring):
            training.fit_model(model, dataset, shard, input_shape, initial_epoch=initial_epoch, epochs=epochs,
                              steps_per_epoch=steps, callbacks=callbacks,
                              shuffle=False)  # the dataset shuffles (Keras 3 warns of its default otherwise)
        if model.stop_training and number < len(plan) - 1:  # a callback stopped it in the resumed epoch
            if saves is not None:
                saves.begin_fit(0, last=True)
                saves.on_train_end()
            break


@contextlib.contextmanager
def _the_rings_own_failure(ring):
    """A peer lost in the ring, raised inside the compiled step, reaches the fit as TensorFlow's error of the
    step: the ring's own PeerLostError (``ring.failure``) is raised instead, a consequence the driver traces
    to its cause (faults.lost_contact)."""
    try:
        yield
    except Exception as exc:
        if ring.failure is None:
            raise
        raise ring.failure from exc


def _model(job, workdir, ring, config, exchanged, widths):
    """The user's model, compiled as they compiled it, its gradients and metrics crossing ``ring`` (the
    variables whose gradients cross, added to ``exchanged`` as the step is traced); the memory checked once
    it is set up. Returns (model, the flavor that trains it, {tensorflow_mb, baseline_mb}, how the gradients travel)."""
    if job.seed is not None:
        _seed(job.seed, job.imports_keras3)
    tensorflow_mb, _ = training.resident_mb()
    model = job.model.build(workdir)
    # the Keras it was built in (a model function's may be either): a Keras 3 model trains natively
    flavor = Keras3() if keras_flavor(model) == "keras3" else TfKeras()
    model = flavor.prepared(model)
    drawn = job.model.drawn_by_each_worker(model)
    if drawn:  # the chief's values to every worker (the strategy gives every variable worker 0's initial value)
        ring.broadcast_variables(drawn)
    model.jit_compile = False  # the exchange is a Python call, which XLA cannot compile
    sent = job.exchange.describe(exchange_gradients(model.optimizer, ring, flavor, job.communication, exchanged,
                                                     last_layers_first=job.exchange.last_layers_first))
    sum_metrics(model, ring, flavor.metrics_reader)
    baseline_mb, _ = training.resident_mb()
    if job.memory_check:
        memory.check_on_host(memory.ModelSize.of_trained(model, job, widths), job.batch_size // ring.size,
                             config["workers_on_host"], int((baseline_mb - tensorflow_mb) * 2**20))
    return model, flavor, {"tensorflow_mb": tensorflow_mb, "baseline_mb": baseline_mb}, sent
