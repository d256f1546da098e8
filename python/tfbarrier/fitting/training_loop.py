"""The training process's side of a fit, one loop for every exchange: the exchange joined (its WorkerSide,
exchange/base.py), the user's model built and made ready in its scope, the exchange hooked into it, the
memory checked, the fitting toolkit's callbacks (training.py) among the exchange's, then ``model.fit`` over
the shard's stream (one fit, or after a resume of a Keras 3 model the rest of the saved epoch first), then
the trained model and what the chief reports for the driver. What differs by Keras is a flavor
(flavors.py); by exchange, the WorkerSide's hooks.

Imported only in training processes, after TensorFlow: the driver never imports TensorFlow.
"""

import dataclasses
import functools
import sys
import time

import tf_keras

from tfbarrier.data import shards, text
from tfbarrier.errors import ModelError
from tfbarrier.fitting import training
from tfbarrier.fitting.checkpoints import Checkpoints, resume_point, start_of
from tfbarrier.fitting.flavors import flavor_of
from tfbarrier.fitting.ring_checkpoints import RingCheckpoints
from tfbarrier.keras_helpers import optimizer_state_left_out
from tfbarrier.models import memory
from tfbarrier.results import FitOutput, ProcessReport


def train(job, config, channel):
    """Run ``job`` (a FitJob) in this training process with the task's ``config``: a ProcessReport."""
    index, workdir, steps_per_epoch = config["tf_config"]["task"]["index"], config["workdir"], config["steps_per_epoch"]
    shard = shards.Shard.open(config["shard"], config["rows"])
    started = time.time()
    side = job.exchange.join(job, config)
    try:
        model, flavor, memory_mb = _model(job, workdir, side, config, shard.width)
        # unknown (a subclassed model): the rows' width, or each named input's (stored_forms.NamedRows)
        input_shape = flavor.input_shape(job, model) or (None if isinstance(shard.width, dict) else (shard.width,))
        job.layout.check_input(input_shape, shard.width)
        resume = resume_point(job.checkpoint_dir)
        timings = {"strategy_and_model": time.time() - started}
        checkpoints = (functools.partial(RingCheckpoints, ring=side.collective, sharded=side.shards_optimizer)
                       if side.collective else Checkpoints)
        progress, epoch_log, saver, saves, callbacks = training.make_callbacks(
            channel, job, workdir, index, resume=resume, batch_rows=job.batch_size // side.size,
            steps_per_epoch=steps_per_epoch, keras=flavor.keras, checkpoints=checkpoints,
            resumes_in_fit=flavor.keras is tf_keras)
        shard = _preprocessed(job, model, shard, saver)
        if saver is not None:
            saver.sharded = side.shards_optimizer
        validation = training.validation_dataset(job, config, input_shape, shard, side.dataset)
        if validation is not None:  # first: every later callback sees its val_*
            callbacks = [flavor.validation(*validation, side.collective, every=job.validation_freq), *callbacks]
        started = time.time()
        try:
            _fits(job, model, flavor, shard, (input_shape, index, side), resume, steps_per_epoch,
                  side.callbacks(callbacks), saves)
        finally:
            progress.stop_keeping_alive()
        timings["training"] = time.time() - started
    finally:
        side.close()
    if saves is not None:
        timings["checkpoints"] = saves.save_seconds
    model = _whole(model, shard)
    with optimizer_state_left_out(model, side.shards_optimizer):
        files, checksum, finished_at = training.wrap_up(progress, started, timings, memory_mb,
                                                        lambda: flavor.write_trained(job, model, workdir, index == 0))
    output = FitOutput(
        steps=progress.steps, checksum=checksum, first_step_at=progress.first_step_at, memory=memory_mb,
        steps_per_execution=flavor.steps_per_execution(model), communication=side.communication(model),
        initial_epoch=epoch_log.initial_epoch or 0, checkpoint_saves=saves and saves.saves,
        resumed_at=resume and dict(zip(("epoch", "step"), start_of(resume, steps_per_epoch)),
                                   steps_done=resume["steps_done"]))
    if index == 0:
        training.chiefs_output(output, job, epoch_log, saver)
    return ProcessReport(timings=timings, python_prefix=sys.prefix, finished_at=finished_at, output=output,
                         files=files)


def _model(job, workdir, side, config, widths):
    """The user's model, compiled as they compiled it, built in the exchange's scope and hooked to it; the
    memory checked once it is set up. Returns (model, its flavor, {tensorflow_mb, baseline_mb})."""
    if job.seed is not None:
        _seed(job.seed, job.imports_keras3)
    tensorflow_mb, _ = training.resident_mb()
    with side.scope():
        # a model spec's variables are made per replica of the strategy it is given
        model = job.model.build(workdir) if side.distribution is None else job.model.build(workdir, side.distribution)
        flavor = flavor_of(model)
        model = flavor.prepared(model, side.distribution, side.optimizer_variables(model))
        side.hook(model, flavor, job)
    baseline_mb, _ = training.resident_mb()
    rows = job.batch_size // side.size
    size = memory.ModelSize.of_trained(model, job, text.sequence_widths(model) if job.layout.takes_text else widths)
    if side.shards_optimizer:
        size = size.sharded(side.size)
    if job.memory_check:
        memory.check_on_host(size, rows, config["workers_on_host"], int((baseline_mb - tensorflow_mb) * 2**20))
    # reported beside the peak, so that a benchmark sets what the check counted against what the process held
    return model, flavor, {"tensorflow_mb": tensorflow_mb, "baseline_mb": baseline_mb,
                           "estimate_mb": size.worker_bytes(rows) / 2**20}


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


def _fits(job, model, flavor, shard, where, resume, steps_per_epoch, callbacks, saves):
    """This attempt's fits (the flavor's plan), each on the shard's stream from the step it starts at.
    ``where``: (the model's input shape, this worker's index, the exchange's WorkerSide)."""
    input_shape, index, side = where
    plan = flavor.plan(resume, job.epochs, steps_per_epoch)
    with side.scope():
        pacer = flavor.pace(model, job, plan, side.collective)
    if pacer is not None:
        callbacks = [pacer, *callbacks]
    for number, (initial_epoch, epochs, steps, first_step) in enumerate(plan):
        if saves is not None:
            saves.begin_fit(steps_per_epoch - steps, last=number == len(plan) - 1)
        dataset = side.dataset(shards.dataset_fn(
            shard, input_shape, job.batch_size, job.data_seed + index, job.shuffle, job.shuffle_buffer,
            job.class_weight, skip_rows=first_step * (job.batch_size // side.size)))
        with side.failures():
            training.fit_model(model, dataset, shard, input_shape, initial_epoch=initial_epoch, epochs=epochs,
                               steps_per_epoch=steps, callbacks=callbacks,
                               shuffle=False)  # the dataset shuffles (Keras 3 warns of its default otherwise)
        if model.stop_training and number < len(plan) - 1:  # a callback stopped it in the resumed epoch
            if saves is not None:
                saves.begin_fit(0, last=True)
                saves.on_train_end()
            break
