"""fit(checkpoint_dir=, checkpoint_every=) for a fit over tfbarrier's ring (exchange/ring_side.py): checkpoints.py's
saves and resume, with the ring in the strategy's place, for Keras 3 and tf_keras models alike.

The same files in ``<checkpoint_dir>/state`` (a TensorFlow checkpoint ``ckpt-N`` of the model, its
optimizer, the epoch and step; ``ckpt-N.json`` written before it: epoch, step, steps_done, rows, the
epoch's metric sums so far), read by checkpoints.resume_point. Every worker holds the same weights and
optimizer state, so the chief alone writes them; the metric sums are every worker's, summed over the ring
first, and the save ends when every worker has passed it on the ring. Where each worker holds a shard of the
optimizer's state (``sharded``: communication's ``shard``), each writes its own in ``state/shard-<index>`` first,
the chief's checkpoint then holds the weights alone, and a resumed worker reads its own shard back.

Keras 3's ``fit`` starts only at an epoch's first step (it has no mid-epoch hook like tf_keras's
``_training_state``, which this callback is for a tf_keras model): a resumed attempt runs the rest of the
saved epoch as a fit of its own, then the epochs after it (``fit_plan``); the chief adds the saved metric sums back at the first
step. The callback is tf_keras's kind, which Keras 3's ``fit`` takes as well.
"""

import json
import os
import time

import numpy as np
import tensorflow as tf
import tf_keras

from tfbarrier import atomic
from tfbarrier.exchange.ring_hooks import average_moving_statistics
from tfbarrier.fitting.checkpoints import MAX_KEPT, STATE_DIR, SaveSchedule, metric_variables, start_of

SHARD_DIR_PREFIX = "shard-"  # + a worker's index: its shard of the optimizer's state (communication's shard)


def fit_plan(resume, epochs, steps_per_epoch):
    """The fits an attempt runs, each (initial_epoch, epochs, steps_per_epoch, the global step it starts
    at): one fit of every epoch, or after a resume the rest of the saved epoch and then the epochs after it."""
    if resume is None:
        return [(0, epochs, steps_per_epoch, 0)]
    epoch, step = start_of(resume, steps_per_epoch)
    plan = []
    if step:
        plan.append((epoch, epoch + 1, steps_per_epoch - step, epoch * steps_per_epoch + step))
        epoch += 1
    if epoch < epochs or not plan:  # no epoch left: a fit of none still ends the checkpoints' state
        plan.append((epoch, max(epoch, epochs), steps_per_epoch, epoch * steps_per_epoch))
    return plan


class RingCheckpoints(SaveSchedule, tf_keras.callbacks.Callback):
    """Saves and restores the training state (see the module); the arguments are checkpoints.Checkpoints'
    and the ``ring``. ``begin_fit`` says where each of the attempt's fits starts."""

    def __init__(self, checkpoint_dir, every, is_chief, worker, resume, batch_rows, steps_per_epoch, ring=None,
                 sharded=False):
        super().__init__()
        self.directory = os.path.join(checkpoint_dir, STATE_DIR)
        self.every, self.is_chief, self.ring, self.sharded = every, is_chief, ring, sharded
        self.shard_directory = os.path.join(self.directory, f"{SHARD_DIR_PREFIX}{worker}")
        self.resume, self.batch_rows, self.steps_per_epoch = resume, batch_rows, steps_per_epoch
        self.every_steps = every[1] if every and every[0] == "steps" else None
        self.saves, self.save_seconds, self._calls = 0, 0.0, 0
        self._last_saved = resume["steps_done"] if resume else 0
        mid_epoch = resume is not None and resume["step"] + 1 < steps_per_epoch
        self._pending_metrics = resume["metrics"] if mid_epoch else None
        self._manager, self._offset, self._last_fit = None, 0, True

    def begin_fit(self, skipped_steps, last):
        """The next fit starts ``skipped_steps`` into its first epoch; ``last``: no fit follows it."""
        self._offset, self._last_fit = skipped_steps, last

    def on_train_begin(self, logs=None):
        if hasattr(self.model, "_training_state"):  # tf_keras's fit asks it where to start (one fit: Keras 3 has none)
            self.model._training_state = self
        if self._manager is not None:
            return
        self._epoch = tf.Variable(-1, dtype=tf.int64, name="checkpoint_epoch")
        self._step = tf.Variable(-1, dtype=tf.int64, name="checkpoint_step")
        counter = {"train_counter": self.model._train_counter} if hasattr(self.model, "_train_counter") else {}
        state = ({"weights": list(self.model.weights)} if self.sharded  # its optimizer's state is this worker's own
                 else {"model": self.model, "optimizer": self.model.optimizer})
        checkpoint = tf.train.Checkpoint(epoch=self._epoch, step=self._step, **state,
                                         **counter)  # tf_keras's step count (TensorBoard's)
        self._manager = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep=MAX_KEPT)
        if self.sharded:  # its shard of the optimizer's state: kept one save longer than the chief's checkpoint
            shard = tf.train.Checkpoint(optimizer=self.model.optimizer)
            self._shards = tf.train.CheckpointManager(shard, self.shard_directory, max_to_keep=MAX_KEPT + 1)
        if self.resume is not None:
            self._manager.restore_or_initialize()
            if self.sharded:
                saved = os.path.join(self.shard_directory, f"ckpt-{self.resume['steps_done']}")
                shard.restore(saved).assert_consumed()
        self._started = time.perf_counter()

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        """(epoch, step) tf_keras's fit starts at: the step after the last save."""
        return start_of(self.resume, steps_per_epoch) if self.resume is not None else (initial_epoch, 0)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_now = epoch

    def on_train_batch_end(self, batch, logs=None):
        batch += self._offset
        self._calls += 1
        if self._pending_metrics is not None:  # the resumed epoch's first step: the saved sums back (chief)
            if self.is_chief:
                for name, variable in metric_variables(self.model):
                    if name in self._pending_metrics:
                        current = variable.numpy()
                        variable.assign(current + np.asarray(self._pending_metrics[name], current.dtype))
            self._pending_metrics = None
        self._save_if_due(batch)

    def on_epoch_end(self, epoch, logs=None):
        self._offset = 0
        self._save(epoch, self.steps_per_epoch - 1, (epoch + 1) * self.steps_per_epoch)

    def on_train_end(self, logs=None):
        """The attempt's last fit is over: a later fit with this checkpoint_dir starts afresh."""
        if hasattr(self.model, "_training_state"):
            self.model._training_state = None
        if self._last_fit and self.is_chief:
            tf.io.gfile.rmtree(self.directory)

    def _save(self, epoch, step, done):
        started = time.perf_counter()
        average_moving_statistics(self.ring, self.model)  # as at an epoch's end: what every worker resumes from
        variables = metric_variables(self.model)
        values = [np.asarray(variable.numpy(), np.float64) for _, variable in variables]
        total = self.ring.all_reduce_sum(np.concatenate([v.reshape(-1) for v in values] or [np.zeros(0)]))
        metrics, at = {}, 0
        for (name, _), value in zip(variables, values):
            metrics[name] = total[at:at + value.size].reshape(value.shape).tolist()
            at += value.size
        if self.sharded:  # every shard written before the chief's save makes this step the one to resume from
            self._shards.save(checkpoint_number=done)
            self.ring.all_reduce_sum(np.zeros(1))
        if self.is_chief:
            self._epoch.assign(epoch)
            self._step.assign(step)
            tf.io.gfile.makedirs(self.directory)
            state = {"epoch": epoch, "step": step, "steps_done": done, "rows": done * self.batch_rows,
                     "metrics": metrics, "saved_at": time.time()}
            with atomic.written_aside(os.path.join(self.directory, f"ckpt-{done}.json"), "w", atomic.gfile(tf)) as f:
                json.dump(state, f)
            self._manager.save(checkpoint_number=done)
            for name in tf.io.gfile.listdir(self.directory):
                if name.startswith("ckpt-") and name.endswith(".json") and name != f"ckpt-{done}.json":
                    tf.io.gfile.remove(os.path.join(self.directory, name))
        self.ring.all_reduce_sum(np.zeros(1))  # every worker leaves the save once the chief has written it
        self._last_saved = done
        self.saves += 1
        self.save_seconds += time.perf_counter() - started

    def _agreed_steps(self, batch):
        """checkpoint_every in seconds as steps: what that many seconds hold on the slowest worker."""
        steps = self._epoch_now * self.steps_per_epoch + batch + 1 - (self.resume or {}).get("steps_done", 0)
        seconds_per_step = (time.perf_counter() - self._started) / max(1, steps)
        slowest = float(self.ring.all_gather(np.array([seconds_per_step])).max())
        return max(1, int(self.every[1] / max(slowest, 1e-6)))
