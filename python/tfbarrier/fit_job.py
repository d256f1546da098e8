"""The ``fit`` kind of job: Keras ``model.fit`` under MultiWorkerMirroredStrategy on each task's shard.

In the task: the partition (or the task's slices of a plain Parquet scan) is streamed to the shard
file, and every worker must have rows. In the training process: the strategy, the model built in its
scope, the streaming tf.data pipeline of the shard, tfbarrier's callbacks (progress heartbeat, epoch
log, checkpoints, TensorBoard) and the user's, then ``model.fit``.
"""

import dataclasses
import json
import os
import sys
import threading
import time

import cloudpickle
import numpy as np
import pyarrow as pa

from . import checks, communication, evaluation, memory, pacing, parquet_source, protocol, rendezvous, saving, shards
from .errors import ColumnError, InvalidArgumentError
from .job import Job, port_clash_is_retryable
from .model_spec import write_weights
from .results import ProcessReport

TRAINED_WEIGHTS_FILE = "trained.safetensors"  # the chief's trained weights (a model object's)
TRAINED_ARCHIVE_FILE = "trained.keras"  # the chief's trained model (a model function's)

VALIDATION_COLUMN = "__tfbarrier_validation"  # with validation_data: True for its rows in the stage's frame


@dataclasses.dataclass
class FitJob(Job):
    """``fit``: what to train (the model, which columns), how (epochs, batch, shuffling, callbacks)
    and where its state goes (checkpoints, saved models, TensorBoard)."""

    model: object = None  # ModelSpec
    layout: object = None  # shards.Layout
    source: list = None  # per worker, the parquet_source.Slices its task reads; None: its partition
    epochs: int = 1
    batch_size: int = 32  # global batch size, split evenly across workers
    steps_per_epoch: int = None  # None: one pass over all rows per epoch
    seed: int = None
    data_seed: int = None  # shuffles each shard, the same on every attempt (fit draws one when seed is None)
    shuffle: bool = True
    shuffle_buffer: int = None  # rows; None: shards.SHUFFLE_BUFFER_ROWS, at most SHUFFLE_BUFFER_BYTES of them
    callbacks: object = None  # transfer.Payload: the cloudpickled function returning a list of tf.keras callbacks
    checkpoint_dir: str = None  # the training state (checkpoints.py) and the epoch log, shared by every worker
    checkpoint_every: tuple = None  # ("steps", n) or ("seconds", s): save within epochs too (checkpoints.py)
    tensorboard_dir: str = None  # the chief's TensorBoard logs
    validation_column: bool = False  # the partitions carry VALIDATION_COLUMN: validation_data's rows
    validation_split: float = None  # the fraction of each partition held out for validation
    validation_freq: int = 1  # validate after every this many epochs
    class_weight: dict = None  # {class id: weight} for training
    save_to: str = None  # the chief saves the model there after each epoch (saving.py)
    save_best: str = None  # ... only when this metric improves
    save_mode: str = "min"  # ... "min" or "max"
    steps_per_execution: object = "auto"  # steps per call into TensorFlow: "auto", n, or None (as compiled)
    communication: dict = None  # how gradients travel: CommunicationOptions' arguments, compression (communication.py)
    memory_check: bool = True  # refuse to train when the host cannot hold what the model needs (memory.py)

    @property
    def validates(self):
        return self.validation_column or bool(self.validation_split)

    # ---- in the task ----
    def write_input(self, batches, path, index):
        if self.source is not None:  # a plain Parquet scan, read here rather than through Spark
            batches = parquet_source.read(self.source[index], self.layout.columns)
        held_out = self._held_out(index)
        if held_out is None:
            rows, checksum = shards.write(batches, path, self.layout)
            return {"rows": rows, "checksum": checksum}
        validation = (os.path.join(os.path.dirname(path), protocol.VALIDATION_FILE), held_out)
        (rows, checksum), (held, held_checksum) = shards.write(batches, path, self.layout, validation)
        return {"rows": rows, "checksum": checksum, "validation_rows": held, "validation_checksum": held_checksum}

    def _held_out(self, index):
        """The function marking the validation rows of each Spark batch, or None without validation.
        validation_split draws them from a generator seeded by (seed, worker): a partition that comes
        in the same order holds out the same rows on every attempt."""
        if self.validation_column:
            return lambda batch: batch.column(VALIDATION_COLUMN)
        if self.validation_split:
            draws = np.random.default_rng([self.seed or 0, index])
            return lambda batch: pa.array(draws.random(len(batch)) < self.validation_split)
        return None

    def check_peers(self, peers):
        if self.validates and not sum(peer["validation_rows"] for peer in peers):
            raise InvalidArgumentError(
                f"validation_split={self.validation_split} held out no row of {sum(p['rows'] for p in peers)}: "
                "raise it, or pass validation_data="
            )
        empty = [i for i, peer in enumerate(peers) if peer["rows"] == 0]
        if empty:
            raise InvalidArgumentError(
                f"partition(s) {empty} of the training data are empty, so those workers have nothing to train "
                "on, although the driver's check found rows for every worker: the data changed in between "
                "(a non-deterministic DataFrame, e.g. sample() without a seed?); cache() it first"
            )

    def agree_steps(self, peers):
        agreed = {"steps_per_epoch": self.steps_per_epoch
                  or rendezvous.steps_per_epoch([p["rows"] for p in peers], self.batch_size)}
        if self.validates:
            agreed["validation_steps"] = rendezvous.validation_steps([p["validation_rows"] for p in peers],
                                                                     self.batch_size)
        return agreed

    # ---- in the training process ----
    def execute(self, tf, config, channel):
        index, workdir = config["tf_config"]["task"]["index"], config["workdir"]
        shard = shards.Shard.open(config["shard"], config["rows"])
        timings = {}
        started = time.time()
        with port_clash_is_retryable():
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=communication.strategy_options(tf, self.communication))
        if self.seed is not None:
            import tf_keras

            tf_keras.utils.set_random_seed(self.seed)
        tensorflow_mb, _ = _resident_mb()
        with strategy.scope():
            model = self.model.build(workdir, strategy)
            communication.compress_gradients(model, self.communication)
            pacer = pacing.resolve(model, self.steps_per_execution, most=self._steps_between_checkpoints())
        if model.distribute_reduction_method == "auto":
            # A step's metric results are already reduced across workers (tf_keras reads them in a
            # merge_call); "auto" would add up every replica's identical copy, at two all-reduces per step.
            model.distribute_reduction_method = "first"
        input_shape = tuple(model.input_shape[1:])
        _check_input(shard, input_shape)
        baseline_mb, _ = _resident_mb()
        if self.memory_check:
            batch = memory.batch_bytes(self.batch_size, len(config["tf_config"]["cluster"]["worker"]), input_shape)
            memory.check_on_host(memory.ModelSize.of(model), batch, config["workers_on_host"],
                                 int((baseline_mb - tensorflow_mb) * 2**20))
        from .checkpoints import resume_point, start_of

        resume = resume_point(self.checkpoint_dir)  # the data pipeline starts where it left off
        batch_rows = self.batch_size // len(config["tf_config"]["cluster"]["worker"])
        dataset = strategy.distribute_datasets_from_function(
            shards.dataset_fn(shard, input_shape, self.batch_size, self.data_seed + index, self.shuffle,
                              self.shuffle_buffer, self.class_weight,
                              skip_rows=resume["steps_done"] * batch_rows if resume else 0)
        )
        validation = self._validation(tf, strategy, config, input_shape, shard)
        timings["strategy_and_model"] = time.time() - started
        progress, epoch_log, saver, saves, callbacks = _callbacks(
            channel, self, workdir, index, validation=validation, resume=resume, batch_rows=batch_rows,
            steps_per_epoch=config["steps_per_epoch"])
        if pacer is not None:
            callbacks.insert(0, pacer)
        started = time.time()
        try:
            _train(tf, model, dataset, shard, input_shape, epochs=self.epochs,
                   steps_per_epoch=config["steps_per_epoch"], callbacks=callbacks)
        finally:
            progress.stop_keeping_alive()
        timings["training"] = time.time() - started
        if progress.first_step_at is not None:  # None when a resumed attempt had no epoch left to run
            timings["first_step"] = progress.first_step_at - started
        started = time.time()
        files, checksum = self._write_trained(model, workdir, index == 0)
        timings["trained_model_written"] = time.time() - started
        finished_at, (_, peak_mb) = time.time(), _resident_mb()
        output = {}
        if index == 0:
            output["history"] = _history(epoch_log.epochs)
            if len(epoch_log.epochs) < self.epochs:  # a callback (EarlyStopping...) stopped the training
                output["stopped_epoch"] = len(epoch_log.epochs) - 1
            if saver is not None:
                output["saved"] = [{"epoch": epoch, "path": os.path.join(self.save_to, name)}
                                   for epoch, name in saver.saved()]
        if saves is not None:
            timings["checkpoints"] = saves.save_seconds
        return ProcessReport(
            timings=timings, python_prefix=sys.prefix, steps=progress.steps, checksum=checksum,
            memory={"tensorflow_mb": tensorflow_mb, "baseline_mb": baseline_mb, "peak_mb": peak_mb},
            first_step_at=progress.first_step_at, finished_at=finished_at,
            initial_epoch=epoch_log.initial_epoch or 0, output=output, files=files,
            resumed_at=resume and dict(zip(("epoch", "step"), start_of(resume, config["steps_per_epoch"])),
                                       steps_done=resume["steps_done"]),
            checkpoint_saves=saves and saves.saves,
            steps_per_execution=int(model.steps_per_execution.numpy()), communication=self.communication or {},
        )

    def _steps_between_checkpoints(self):
        """The most steps a call into TensorFlow may run: a checkpoint comes at a call's end."""
        if self.checkpoint_every and self.checkpoint_every[0] == "steps":
            return min(pacing.MAX_STEPS, self.checkpoint_every[1])
        return pacing.MAX_STEPS

    def _write_trained(self, model, workdir, is_chief):
        """(the chief's files for the driver, the weights' checksum). Every worker reads its weights, in
        the same order (a variable synchronized on read is all-reduced when read); the chief writes
        them: as a weights file for a model object, as a ``.keras`` archive for a model function's."""
        if self.model.flavor != "function":
            path = os.path.join(workdir, TRAINED_WEIGHTS_FILE)
            checksum = write_weights(model.weights, path if is_chief else None)
            return ({"weights": TRAINED_WEIGHTS_FILE} if is_chief else {}), checksum
        path = os.path.join(workdir, TRAINED_ARCHIVE_FILE)
        model.save(path)  # every worker saves: reading the weights may be a collective
        if not is_chief:
            os.unlink(path)
        return ({"archive": TRAINED_ARCHIVE_FILE} if is_chief else {}), write_weights(model.weights)

    def _validation(self, tf, strategy, config, input_shape, training):
        """(distributed validation dataset, steps) when the job validates, else None."""
        if not config.get("validation_steps"):
            return None
        path = os.path.join(os.path.dirname(config["shard"]), protocol.VALIDATION_FILE)
        shard = shards.Shard.open(path, config["validation_rows"])
        if shard.rows:
            _check_input(shard, input_shape)
        else:  # this worker validates padding only, in the form of its training rows (an empty file has none)
            shard = dataclasses.replace(shard, width=training.width, label_dtype=training.label_dtype)
        steps = config["validation_steps"]
        dataset = strategy.distribute_datasets_from_function(
            shards.validation_dataset_fn(shard, input_shape, self.batch_size, steps))
        return dataset, steps


def _history(epochs):
    """{metric: one value per epoch}; None where an epoch has no value (val_* between validations)."""
    keys = list(dict.fromkeys(key for epoch in epochs for key in epoch))
    return {key: [epoch.get(key) for epoch in epochs] for key in keys}


def _callbacks(channel, job, workdir, index, validation=None, resume=None, batch_rows=None, steps_per_epoch=None):
    """tfbarrier's own Keras callbacks: validation (first, so that every later callback sees val_*),
    step clock and progress heartbeat, the epoch log, the saved models (save_to), and the checkpoints
    when there is a checkpoint directory (after them, so that a resumed attempt finds the epoch it
    resumes after logged and saved); then the user's. ``resume``: where this attempt starts
    (checkpoints.resume_point)."""
    import tf_keras

    is_chief = index == 0
    resumed_steps = resume["steps_done"] if resume else 0
    resumed_step_in_epoch = resumed_steps % steps_per_epoch if steps_per_epoch else 0

    class Progress(tf_keras.callbacks.Callback):
        """Counts steps, notes the first one, and tells the task (at most once a second) that
        training moves: the task's stall watchdog listens for it."""

        def __init__(self):
            super().__init__()
            self.steps = 0  # steps run by this process
            self.skipped = resumed_steps  # steps a resumed run did not have to run again
            self.first_step_at = None
            self._last_sent = 0.0
            self._before_epoch = 0  # steps run by this process before the current epoch
            self._epoch_start = resumed_step_in_epoch  # the step the current epoch started at in this process

        def _send(self, **fields):
            self._last_sent = time.monotonic()
            channel.send(protocol.PROGRESS, steps=self.skipped + self.steps, **fields)

        def on_train_begin(self, logs=None):
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
        """Per-epoch logs across resumed attempts. The chief keeps them in the checkpoint directory
        before the epoch's checkpoint is saved, so the log never lags the checkpoint; on resume,
        entries past the restored epoch are dropped."""

        def __init__(self):
            super().__init__()
            self.path = os.path.join(job.checkpoint_dir, "epochs.json") if job.checkpoint_dir else None
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
            if self.path and is_chief:
                tmp = self.path + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(self.epochs, f)
                os.replace(tmp, self.path)

    progress, epoch_log = Progress(), EpochLog()
    callbacks = [progress, epoch_log]
    saver = None
    if job.save_to:
        saver = saving.save_callback(job.model, job.save_to, job.save_best, job.save_mode, is_chief, epoch_log)
        callbacks.append(saver)
    if validation is not None:
        callbacks.insert(0, evaluation.validation_callback(*validation, every=job.validation_freq))
    saves = None
    if job.checkpoint_dir:
        from .checkpoints import Checkpoints

        saves = Checkpoints(job.checkpoint_dir, job.checkpoint_every, is_chief, index, resume, batch_rows,
                            steps_per_epoch)
        callbacks.append(saves)
    if job.tensorboard_dir and is_chief:
        callbacks.append(tf_keras.callbacks.TensorBoard(job.tensorboard_dir))
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
    if model.distribute_reduction_method in ("auto", "sum"):
        return model.distribute_strategy.num_replicas_in_sync
    return 1


def _resident_mb():
    """(current, peak) resident memory of this process in MB (current is None off Linux)."""
    import resource

    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        current = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
    return current, peak / (2**20 if sys.platform == "darwin" else 1024)


def _check_input(shard, input_shape):
    """A model function's input shape is known only here."""
    if shard.images:
        checks.check_image_input(input_shape)
    else:
        checks.check_input_width(shard.width, input_shape)


def _train(tf, model, dataset, shard, input_shape, **fit_args):
    """``model.fit``; an image that does not decode becomes a ColumnError naming its row."""
    try:
        model.fit(dataset, verbose=0, **fit_args)
    except tf.errors.InvalidArgumentError:  # what decode_image raises (a failed peer is another error)
        bad = shards.first_undecodable(shard, input_shape) if shard.images else None
        if bad is None:
            raise
        raise ColumnError(
            f"row {bad[0]} of this worker's partition does not decode as an image ({bad[1]}): the image "
            "column must hold whole PNG, JPEG, GIF or BMP files; filter out the broken ones first"
        ) from None
