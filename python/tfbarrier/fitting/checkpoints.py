"""fit(checkpoint_dir=, checkpoint_every=): the training state, saved where every worker reaches it, so
that a job submitted again after a failure (max_retries) resumes where the last save left off: at the
step after it, with every worker's position in its data restored, so that no step is repeated and
none is skipped, and each epoch's metrics are those of an uninterrupted fit.

What a save holds (in ``<checkpoint_dir>/state``): a TensorFlow checkpoint ``ckpt-N`` of the model and
its optimizer (N: the steps run so far), and ``ckpt-N.json``, written before it: the epoch and step it
was saved at, the rows each worker had taken from its shard, and the running sums of the epoch's
metrics. Saved at every epoch's end and, with ``checkpoint_every``, every that many steps (or, given
in seconds, every as many steps as take that long on the slowest worker, measured at the start).

Resuming: the worker reads the last save's ``.json`` before its data pipeline is made
(``resume_point``), which then skips the rows taken before it (the pipeline is deterministic: its
shuffling is seeded, the same on every attempt); fit starts at the saved epoch and step (tf_keras's
``model._training_state`` hook, as its BackupAndRestore does), the checkpoint restores the weights, the
optimizer and the step counter, and the metric sums are added back after the first call. Random
layers (Dropout) draw afresh.

Every worker reads the variables a save holds in the same order (a variable synchronized on read,
BatchNormalization's moving statistics and the metrics, is all-reduced when read); the chief writes.
Where the checkpoint holds no such variable, only the chief saves; otherwise the others save too, to a
scratch directory they remove (as tf_keras does), so that the all-reduces meet. A save ends with an
all-reduce: once any worker trains on, the save is whole.
"""

import json
import os
import time

import tensorflow as tf
import tf_keras

from tfbarrier import atomic
from tfbarrier.fitting.pacing import everyones
from tfbarrier.settings import CHECKPOINT_DECIDE_AT_CALL

STATE_DIR = "state"
MAX_KEPT = 1  # checkpoints kept (and their .json)


def _state_dir(checkpoint_dir):
    return os.path.join(checkpoint_dir, STATE_DIR)


def resume_point(checkpoint_dir):
    """The last save's state (epoch, step, steps_done, rows, metrics), or None when there is none."""
    if not checkpoint_dir:
        return None
    latest = tf.train.latest_checkpoint(_state_dir(checkpoint_dir))
    if latest is None:
        return None
    with tf.io.gfile.GFile(latest + ".json") as f:
        return json.load(f)


def start_of(resume, steps_per_epoch):
    """(epoch, step) a fit resumed from ``resume`` (resume_point's) starts at: the step after the save."""
    epoch, step = resume["epoch"], resume["step"]
    return (epoch + 1, 0) if step + 1 >= steps_per_epoch else (epoch, step + 1)


def _on_read(variable):
    return getattr(variable, "synchronization", None) == tf.VariableSynchronization.ON_READ


def metric_variables(model):
    """(name, variable) of every metric's state, in an order the same on every worker."""
    return [(f"{metric.name}/{i}", variable) for metric in model.metrics for i, variable in enumerate(metric.variables)]


class SaveSchedule:
    """When a checkpoint callback saves within an epoch: every ``every_steps`` steps, or, with ``every`` in
    seconds, every as many steps as that many seconds hold on the slowest worker (``_agreed_steps``,
    decided at call CHECKPOINT_DECIDE_AT_CALL). Mixed into Checkpoints and native_checkpoints'."""

    def _save_if_due(self, batch):
        """After step ``batch`` (from 0) of the current epoch: save when a save is due there."""
        seconds_mode = self.every and self.every[0] == "seconds"
        if seconds_mode and self.every_steps is None and self._calls == CHECKPOINT_DECIDE_AT_CALL:
            self.every_steps = self._agreed_steps(batch)
        if self.every_steps and batch + 1 < self.steps_per_epoch:
            done = self._epoch_now * self.steps_per_epoch + batch + 1
            if done // self.every_steps > self._last_saved // self.every_steps:
                self._save(self._epoch_now, batch, done)


class Checkpoints(SaveSchedule, tf_keras.callbacks.Callback):
    """Saves and restores the training state (see the module). ``every``: ("steps", n), ("seconds", s)
    or None (epoch ends only); ``resume``: what ``resume_point`` returned; ``batch_rows``: rows a
    worker takes per step."""

    def __init__(self, checkpoint_dir, every, is_chief, worker, resume, batch_rows, steps_per_epoch):
        super().__init__()
        self.directory = _state_dir(checkpoint_dir)
        self.every, self.is_chief, self.worker = every, is_chief, worker
        self.resume, self.batch_rows, self.steps_per_epoch = resume, batch_rows, steps_per_epoch
        self.every_steps = every[1] if every and every[0] == "steps" else None
        self.saves, self.save_seconds = 0, 0.0
        self._calls = 0
        self._last_saved = resume["steps_done"] if resume else 0
        mid_epoch = resume is not None and resume["step"] + 1 < steps_per_epoch
        self._pending_metrics = resume["metrics"] if mid_epoch else None  # the resumed epoch's sums so far

    def begin_fit(self, skipped_steps, last):
        """Where the attempt's fit starts: tf_keras's own ``_training_state`` (this callback) resumes mid-epoch,
        so its one fit needs nothing more (ring_checkpoints.RingCheckpoints has more to do for Keras 3)."""

    # ---- set-up and restore ---------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        model, optimizer = self.model, self.model.optimizer  # its slots exist (optimizers.build): a restore fills them
        self._epoch = tf.Variable(-1, dtype=tf.int64, name="checkpoint_epoch")
        self._step = tf.Variable(-1, dtype=tf.int64, name="checkpoint_step")
        checkpoint = tf.train.Checkpoint(model=model, epoch=self._epoch, step=self._step,
                                         train_counter=model._train_counter)
        checkpoint.save_counter  # noqa: B018 - made here by every worker: made at a save, it would be the chief's alone
        self._reader = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep=MAX_KEPT)
        optimizer_variables = optimizer.variables() if callable(optimizer.variables) else optimizer.variables
        self._all_save = any(_on_read(v) for v in [*model.variables, *optimizer_variables])
        if self.is_chief:
            self._writer = self._reader
        else:
            scratch = os.path.join(self.directory, f"workertemp_{self.worker}")
            self._writer = tf.train.CheckpointManager(checkpoint, scratch, max_to_keep=MAX_KEPT)
        if self.resume is not None:
            self._reader.restore_or_initialize()
        self._started = time.perf_counter()
        model._training_state = self  # fit asks it where to start

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        """(epoch, step) fit starts at: the step after the last save (tf_keras's hook)."""
        return start_of(self.resume, steps_per_epoch) if self.resume is not None else (initial_epoch, 0)

    # ---- during training --------------------------------------------------------------------------
    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_now = epoch

    def on_train_batch_end(self, batch, logs=None):
        self._calls += 1
        if self._pending_metrics is not None:  # the resumed epoch's first call: add the saved sums back
            self._add_metrics(self._pending_metrics)
            self._pending_metrics = None
        self._save_if_due(batch)

    def on_epoch_end(self, epoch, logs=None):
        done = (epoch + 1) * self.steps_per_epoch
        self._save(epoch, self.steps_per_epoch - 1, done)

    def on_train_end(self, logs=None):
        """Training is over: a later fit with this checkpoint_dir starts afresh."""
        self.model._training_state = None
        if self.is_chief:
            tf.io.gfile.rmtree(self.directory)

    # ---- the parts ------------------------------------------------------------------------------------
    def _save(self, epoch, step, done):
        started = time.perf_counter()
        metrics = {name: variable.read_value().numpy().tolist() for name, variable in metric_variables(self.model)}
        self._epoch.assign(epoch)
        self._step.assign(step)
        if self.is_chief:
            tf.io.gfile.makedirs(self.directory)
            state = {"epoch": epoch, "step": step, "steps_done": done, "rows": done * self.batch_rows,
                     "metrics": metrics, "saved_at": time.time()}
            path = os.path.join(self.directory, f"ckpt-{done}.json")
            with atomic.written_aside(path, "w", atomic.gfile(tf)) as f:
                json.dump(state, f)
        if self.is_chief or self._all_save:
            self._writer.save(checkpoint_number=done)
            if not self.is_chief:
                tf.io.gfile.rmtree(self._writer.directory)
        if self.is_chief:
            self._remove_old_states(done)
        everyones(self.model, 0.0)  # every worker leaves the save once the chief has written it
        self._last_saved = done
        self.saves += 1
        self.save_seconds += time.perf_counter() - started

    def _remove_old_states(self, kept):
        for name in tf.io.gfile.listdir(self.directory):
            if name.startswith("ckpt-") and name.endswith(".json") and name != f"ckpt-{kept}.json":
                tf.io.gfile.remove(os.path.join(self.directory, name))

    def _add_metrics(self, saved):
        """Add the saved running sums of the epoch's metrics to this attempt's: the chief adds the
        workers' total (what was read across them), the others nothing. A metric variable that is not
        summed across workers is left as it is."""
        strategy = self.model.distribute_strategy
        for name, variable in metric_variables(self.model):
            if name not in saved or not self.is_chief or variable.aggregation != tf.VariableAggregation.SUM:
                continue
            for component in strategy.experimental_local_results(variable):
                component.assign_add(tf.cast(saved[name], component.dtype))

    def _agreed_steps(self, batch):
        """checkpoint_every in seconds as steps: what that many seconds hold on the slowest worker."""
        steps = self._epoch_now * self.steps_per_epoch + batch + 1 - (self.resume or {}).get("steps_done", 0)
        seconds_per_step = max(everyones(self.model, (time.perf_counter() - self._started) / max(1, steps)))
        return max(1, int(self.every[1] / max(seconds_per_step, 1e-6)))
