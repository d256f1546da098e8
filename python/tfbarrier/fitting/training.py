"""The training process's toolkit for a fit (training_loop.py's): tfbarrier's callbacks (the progress heartbeat,
the epoch log, saved models, checkpoints, TensorBoard) with the user's, the model's fit, the chief's trained
model and history for the driver, and the process's memory.

Imported only in training processes, after TensorFlow: the driver never imports TensorFlow.
"""

import dataclasses
import json
import os
import sys
import threading
import time

import cloudpickle
import tensorflow as tf
import tf_keras

from tfbarrier import atomic
from tfbarrier.data import shards
from tfbarrier.errors import ColumnError
from tfbarrier.fitting import pacing, saving
from tfbarrier.fitting.checkpoints import Checkpoints
from tfbarrier.keras_helpers import optimizer_state_left_out
from tfbarrier.models.weights_file import write_weights
from tfbarrier.spark import protocol

TRAINED_WEIGHTS_FILE = "trained.safetensors"  # the chief's trained weights (a model object's)
TRAINED_ARCHIVE_FILE = "trained.keras"  # the chief's trained model (a model function's)


def chiefs_output(output, job, epoch_log, saver):
    """Add what only the chief reports to its ``output``: the history, an early stop, the saved models."""
    output.history = history_of(epoch_log.epochs)
    if len(epoch_log.epochs) < job.epochs:  # a callback (EarlyStopping...) stopped the training
        output.stopped_epoch = len(epoch_log.epochs) - 1
    if saver is not None:
        output.saved = [{"epoch": epoch, "path": os.path.join(job.save_to, name)} for epoch, name in saver.saved()]


def steps_between_checkpoints(job):
    """The most steps a call into TensorFlow may run: a checkpoint comes at a call's end."""
    if job.checkpoint_every and job.checkpoint_every[0] == "steps":
        return min(pacing.MAX_STEPS, job.checkpoint_every[1])
    return pacing.MAX_STEPS


def write_trained(job, model, workdir, is_chief):
    """(the chief's files for the driver, the weights' checksum). Every worker reads its weights, in
    the same order (a variable synchronized on read is all-reduced when read); the chief writes
    them: as a weights file for a model object, as a ``.keras`` archive for a model function's."""
    if job.model.flavor != "function":
        path = os.path.join(workdir, TRAINED_WEIGHTS_FILE)
        checksum = write_weights(model.weights, path if is_chief else None)
        return ({"weights": TRAINED_WEIGHTS_FILE} if is_chief else {}), checksum
    # under the strategy every worker saves: reading the weights is a collective
    return write_archive(model, workdir, is_chief, every_worker=job.tensorflow_server)


def write_archive(model, workdir, is_chief, every_worker=False):
    """(the chief's ``.keras`` archive of ``model`` for the driver, the weights' checksum); ``every_worker``: each
    worker saves one, the others' deleted."""
    path = os.path.join(workdir, TRAINED_ARCHIVE_FILE)
    if is_chief or every_worker:
        save_archive(model, path)
        if not is_chief:
            os.unlink(path)
    return ({"archive": TRAINED_ARCHIVE_FILE} if is_chief else {}), write_weights(model.weights)


def save_archive(model, path):
    """Save ``model`` (Keras 3 or tf_keras) as a ``.keras`` archive with its optimizer's config but not its state:
    Keras builds the archive's weights file in memory, where Adam's slots tripled what the archive took (a model
    function's training process peaked at 1.5x what the step held: bench/README.md, issue 74); the driver's model
    gets a fresh optimizer of the same config, as a model object's keeps its own. An optimizer that cannot be made
    again from its config is saved with its state."""
    try:
        type(model.optimizer).from_config(model.optimizer.get_config())
        remade = True
    except Exception:  # noqa: BLE001 - a custom optimizer without a config: saved as it is
        remade = False
    with optimizer_state_left_out(model, remade):
        model.save(path)


def validation_dataset(job, config, input_shape, training, distribute):
    """(this worker's validation dataset, steps) when the job validates, else None; ``distribute``: the
    exchange's ``WorkerSide.dataset``, which makes it from shards.validation_dataset_fn's function."""
    if not config.get("validation_steps"):
        return None
    path = os.path.join(os.path.dirname(config["shard"]), protocol.VALIDATION_FILE)
    shard = shards.Shard.open(path, config["validation_rows"])
    if shard.rows:
        job.layout.check_input(input_shape, shard.width)
    else:  # this worker validates padding only, in the form of its training rows (an empty file has none)
        shard = dataclasses.replace(shard, width=training.width, label_dtype=training.label_dtype,
                                    weight_length=training.weight_length, stored=training.stored)
    shard = dataclasses.replace(shard, text=training.text)
    steps = config["validation_steps"]
    return distribute(shards.validation_dataset_fn(shard, input_shape, job.batch_size, steps)), steps


def history_of(epochs):
    """{metric: one value per epoch}; None where an epoch has no value (val_* between validations)."""
    keys = list(dict.fromkeys(key for epoch in epochs for key in epoch))
    return {key: [epoch.get(key) for epoch in epochs] for key in keys}


class Progress(tf_keras.callbacks.Callback):
    """Counts steps, notes the first one, and tells the task (at most once a second) that training
    moves: the task's stall watchdog listens for it. ``resumed_steps``: the steps a resumed attempt
    does not run again."""

    def __init__(self, channel, resumed_steps=0, steps_per_epoch=None):
        super().__init__()
        self.channel = channel
        self.steps = 0  # steps run by this process
        self.skipped = resumed_steps
        self.first_step_at = None
        self._last_sent = 0.0
        self._before_epoch = 0  # steps run by this process before the current epoch
        # the step the current epoch started at in this process
        self._epoch_start = resumed_steps % steps_per_epoch if steps_per_epoch else 0

    def _send(self, **fields):
        self._last_sent = time.monotonic()
        self.channel.send(protocol.PROGRESS, steps=self.skipped + self.steps, **fields)

    def on_train_begin(self, logs=None):
        self.stop_keeping_alive()  # a resumed ring fit's second fit (ring_checkpoints.fit_plan)
        self._summed = _replicas_summed_in_batch_logs(self.model)
        self._send(total_steps=self.params["epochs"] * self.params["steps"])

    def on_train_batch_end(self, batch, logs=None):
        # ``batch`` is the epoch's last step run: with steps_per_execution > 1, Keras calls this once
        # per execution, after several steps.
        self.steps = self._before_epoch + batch + 1 - self._epoch_start
        if self.first_step_at is None:
            self.first_step_at = time.time()
        if time.monotonic() - self._last_sent >= 1.0:
            loss = (logs or {}).get("loss")
            self._send(loss=None if loss is None else float(loss) / self._summed)

    def on_epoch_begin(self, epoch, logs=None):
        if self.steps:
            self._epoch_start = 0
        self._before_epoch = self.steps

    def on_epoch_end(self, epoch, logs=None):
        logs = {k: float(v) for k, v in (logs or {}).items()}
        self._send(epoch=epoch, logs=logs, loss=logs.get("loss"))  # the bar ends the epoch on its loss

    def on_train_end(self, logs=None):
        # fit returns only once its data iterator is deleted, which can wait many seconds for a tf.data
        # thread (longer the longer the fit ran): the last step is done, so tell the watchdog meanwhile.
        self._done = threading.Event()
        self._keeper = threading.Thread(target=self._keep_alive, daemon=True, name="tfbarrier-keep-alive")
        self._keeper.start()

    def _keep_alive(self):
        while not self._done.wait(1.0):
            self._send()

    def stop_keeping_alive(self):
        """After fit: the process's own messages follow (a channel has one writer at a time)."""
        keeper = getattr(self, "_keeper", None)
        if keeper is not None:
            self._done.set()
            keeper.join()


class EpochLog(tf_keras.callbacks.Callback):
    """Per-epoch logs across resumed attempts. With a checkpoint directory, the chief keeps them there
    before the epoch's checkpoint is saved, so the log never lags the checkpoint; on resume, entries
    past the restored epoch are dropped."""

    def __init__(self, checkpoint_dir, is_chief):
        super().__init__()
        self.path = os.path.join(checkpoint_dir, "epochs.json") if checkpoint_dir else None
        self.is_chief = is_chief
        self.epochs = []
        self.initial_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.initial_epoch is None:
            self.initial_epoch = epoch
            if self.path and os.path.exists(self.path):
                with open(self.path) as f:
                    self.epochs = json.load(f)[:epoch]

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({k: float(v) for k, v in (logs or {}).items()})
        if self.path and self.is_chief:
            with atomic.written_aside(self.path, "w") as f:
                json.dump(self.epochs, f)


def make_callbacks(channel, job, workdir, index, resume=None, batch_rows=None, steps_per_epoch=None,
                   keras=tf_keras, checkpoints=Checkpoints, resumes_in_fit=True):
    """tfbarrier's own Keras callbacks: step clock and progress heartbeat, the epoch log, the saved models (save_to), and the checkpoints
    when there is a checkpoint directory (after them, so that a resumed attempt finds the epoch it
    resumes after logged and saved); then the user's. ``resume``: where this attempt starts
    (checkpoints.resume_point); ``keras``: the Keras of the model (TensorBoard's); ``checkpoints``: the
    class of the checkpoints' callback; ``resumes_in_fit``: tf_keras's fit starts mid-epoch (its
    ``_training_state``) and numbers the resumed epoch's steps from there, where a Keras 3 fit runs the rest
    of the epoch as a fit of its own (ring_checkpoints.fit_plan), numbered from 0. Returns (progress, epoch log, saver, checkpoints, every callback)."""
    is_chief = index == 0
    progress = Progress(channel, resume["steps_done"] if resume else 0, steps_per_epoch if resumes_in_fit else None)
    epoch_log = EpochLog(job.checkpoint_dir, is_chief)
    callbacks = [progress, epoch_log]
    saver = None
    if job.save_to:
        saver = saving.SaveModel(job.model, job.save_to, job.save_best, job.save_mode, is_chief, epoch_log)
        callbacks.append(saver)
    saves = None
    if job.checkpoint_dir:
        saves = checkpoints(job.checkpoint_dir, job.checkpoint_every, is_chief, index, resume, batch_rows,
                            steps_per_epoch)
        callbacks.append(saves)
    if job.tensorboard_dir and is_chief:
        callbacks.append(keras.callbacks.TensorBoard(job.tensorboard_dir))
    if job.callbacks:
        with open(job.callbacks.path(workdir), "rb") as f:
            callbacks.extend(cloudpickle.load(f)())
    return progress, epoch_log, saver, saves, callbacks


def _replicas_summed_in_batch_logs(model):
    """How many replicas' running means a batch's logs add up. tf_keras reduces them with the model's
    ``distribute_reduction_method``, which by default ("auto") sums across replicas off TPUs
    (``training.reduce_per_replica``): with 2 workers a batch's "loss" is about twice the loss. Every
    replica runs as many batches of one size, so the sum over replicas is the mean times their count.
    The epoch's logs are reduced properly (``get_metrics_result`` across replicas)."""
    if getattr(model, "distribute_reduction_method", None) in ("auto", "sum"):
        return model.distribute_strategy.num_replicas_in_sync
    return 1


def wrap_up(progress, started, timings, memory_mb, write_trained):
    """After training (``started`` then): the first step's time, the trained model written by
    ``write_trained()`` ((files, checksum)) and the seconds it took, the peak memory; (files, checksum, the time)."""
    if progress.first_step_at is not None:  # None when a resumed attempt had no epoch left to run
        timings["first_step"] = progress.first_step_at - started
    writing = time.time()
    files, checksum = write_trained()
    timings["trained_model_written"] = time.time() - writing
    finished_at, (_, memory_mb["peak_mb"]) = time.time(), resident_mb()
    return files, checksum, finished_at


def resident_mb():
    """(current, peak) resident memory of this process in MB (current is None off Linux)."""
    import resource

    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        current = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
    return current, peak / (2**20 if sys.platform == "darwin" else 1024)


def fit_model(model, dataset, shard, input_shape, **fit_args):
    """``model.fit``; an image that does not decode becomes a ColumnError naming its row."""
    try:
        model.fit(dataset, verbose=0, **fit_args)
    except tf.errors.InvalidArgumentError:  # what decode_image raises (a failed peer is another error)
        bad = shard.first_unreadable(input_shape)
        if bad is None:
            raise
        raise ColumnError(
            f"row {bad[0]} of this worker's partition does not decode as an image ({bad[1]}): the image "
            "column must hold whole PNG, JPEG, GIF or BMP files; filter out the broken ones first"
        ) from None
