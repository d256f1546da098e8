"""The training process's side of a fit under MultiWorkerMirroredStrategy (the "strategy" exchange: several
GPUs per worker, or ``exchange="strategy"``): the strategy, the model rebuilt in its scope with its optimizer
ready, the shard's tf.data pipeline distributed by it, the fitting toolkit's callbacks and the user's,
``model.fit``, then the chief's trained weights and history for the driver.

Imported only in training processes, after TensorFlow: the driver never imports TensorFlow.
"""

import sys
import time

import tensorflow as tf
import tf_keras

from tfbarrier.data import shards
from tfbarrier.exchange import strategy
from tfbarrier.faults import port_clash_is_retryable
from tfbarrier.fitting import optimizers, pacing, training
from tfbarrier.fitting.checkpoints import resume_point, start_of
from tfbarrier.models import memory
from tfbarrier.results import FitOutput, ProcessReport


def train(job, config, channel):
    """Run ``job`` (a FitJob) in this training process with the task's ``config``: a ProcessReport."""
    index, workdir = config["tf_config"]["task"]["index"], config["workdir"]
    num_workers = len(config["tf_config"]["cluster"]["worker"])
    shard = shards.Shard.open(config["shard"], config["rows"])
    started = time.time()
    distribution, model, pacer, memory_mb = _strategy_and_model(job, workdir, shard, num_workers, config)
    input_shape = tuple(model.input_shape[1:])
    resume = resume_point(job.checkpoint_dir)  # the data pipeline starts where it left off
    batch_rows = job.batch_size // num_workers
    dataset = distribution.distribute_datasets_from_function(
        shards.dataset_fn(shard, input_shape, job.batch_size, job.data_seed + index, job.shuffle,
                          job.shuffle_buffer, job.class_weight,
                          skip_rows=resume["steps_done"] * batch_rows if resume else 0)
    )
    validation = training.validation_dataset(job, distribution, config, input_shape, shard)
    timings = {"strategy_and_model": time.time() - started}
    progress, epoch_log, saver, saves, callbacks = training.make_callbacks(
        channel, job, workdir, index, validation=validation, resume=resume, batch_rows=batch_rows,
        steps_per_epoch=config["steps_per_epoch"])
    if pacer is not None:
        callbacks.insert(0, pacer)
    started = time.time()
    try:
        training.fit_model(model, dataset, shard, input_shape, epochs=job.epochs,
                           steps_per_epoch=config["steps_per_epoch"], callbacks=callbacks)
    finally:
        progress.stop_keeping_alive()
    timings["training"] = time.time() - started
    files, checksum, finished_at = training.wrap_up(progress, started, timings, memory_mb,
                                                    lambda: training.write_trained(job, model, workdir, index == 0))
    output = FitOutput(
        steps=progress.steps, checksum=checksum, first_step_at=progress.first_step_at, memory=memory_mb,
        initial_epoch=epoch_log.initial_epoch or 0,
        resumed_at=resume and dict(zip(("epoch", "step"), start_of(resume, config["steps_per_epoch"])),
                                   steps_done=resume["steps_done"]),
        checkpoint_saves=saves and saves.saves, steps_per_execution=int(model.steps_per_execution.numpy()),
        communication=job.exchange.describe(strategy.in_effect(distribution, model)))
    if index == 0:
        training.chiefs_output(output, job, epoch_log, saver)
    if saves is not None:
        timings["checkpoints"] = saves.save_seconds
    return ProcessReport(timings=timings, python_prefix=sys.prefix, finished_at=finished_at, output=output, files=files)


def _strategy_and_model(job, workdir, shard, num_workers, config):
    """The strategy, the model rebuilt in its scope with its optimizer ready (slots, fused updates, the
    gradients' exchange), the pacer of its steps per call; the memory checked once it is all set up.
    Returns (the strategy, model, pacer, {tensorflow_mb, baseline_mb})."""
    with port_clash_is_retryable():
        distribution = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=strategy.strategy_options(tf, job.communication))
    if job.seed is not None:
        tf_keras.utils.set_random_seed(job.seed)
    tensorflow_mb, _ = training.resident_mb()
    with distribution.scope():
        model = job.model.build(workdir, distribution)
        optimizers.build(model, distribution)
        optimizers.fuse_updates(model)
        strategy.all_reduce_in_pieces(model, job.communication)
        strategy.compress_gradients(model, job.communication)
        pacer = pacing.resolve(model, job.steps_per_execution, most=training.steps_between_checkpoints(job))
    if model.distribute_reduction_method == "auto":
        # A step's metric results are already reduced across workers (tf_keras reads them in a
        # merge_call); "auto" would add up every replica's identical copy, at two all-reduces per step.
        model.distribute_reduction_method = "first"
    input_shape = tuple(model.input_shape[1:])
    job.layout.check_input(input_shape, shard.width)  # a model function's input shape is known only here
    baseline_mb, _ = training.resident_mb()
    if job.memory_check:
        memory.check_on_host(memory.ModelSize.of_trained(model, job), job.batch_size // num_workers,
                             config["workers_on_host"], int((baseline_mb - tensorflow_mb) * 2**20))
    return distribution, model, pacer, {"tensorflow_mb": tensorflow_mb, "baseline_mb": baseline_mb}
