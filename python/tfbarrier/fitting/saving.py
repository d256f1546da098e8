"""fit(save_to=dir): the chief writes the model to ``dir`` while it trains, so a long job leaves
usable models behind even if the driver dies.

Each save is a ``.keras`` archive in the user's Keras, the archive ``FitResult.save`` writes: a
Keras model passed to fit is rebuilt in its own Keras (Keras 3 or tf_keras) from its config with the
trained weights, since a tf_keras archive does not load in Keras 3; a model function's tf_keras model
is saved as it is. A preset's task is saved as a preset directory (``epoch-001/``; its LoRA adapters merged
into the weights). Every completed epoch is kept (``epoch-001.keras``, ...) or, with ``save_best``, only
the best one by that metric so far (``best.keras``). ``saved.json`` lists what was written, with each
epoch's logs; a resumed attempt carries it on. Files are written aside and renamed into place: on a
local or POSIX file system a reader never sees half an archive.
"""

import concurrent.futures
import json
import os
import tempfile

import tensorflow as tf
import tf_keras

from tfbarrier import atomic
from tfbarrier.data import text
from tfbarrier.errors import ModelError
from tfbarrier.keras_helpers import optimizer_state_left_out
from tfbarrier.models.model_spec import save_archive
from tfbarrier.ranking import better

MANIFEST = "saved.json"


def file_name(epoch, best, preset=False):
    """The archive of ``epoch`` (from 0), or with ``preset`` its preset directory."""
    name = "best" if best else f"epoch-{epoch + 1:03d}"
    return name if preset else name + ".keras"


def read_manifest(directory):
    """The entries of ``directory``'s saved.json, oldest first ([] when there is none)."""
    path = os.path.join(directory, MANIFEST)
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


class SaveModel(tf_keras.callbacks.Callback):
    """Saves the model after each epoch (or each improvement of ``monitor``, in ``mode``) to ``directory``.
    Reading the weights may be a collective (variables summed on read), so every worker reads them at the
    same epochs: the decision rests on the epoch's logs, the same on every worker, and on a resumed attempt
    on the restored epochs' logs (``epoch_log``, which runs before). Only the chief writes."""

    def __init__(self, spec, directory, monitor, mode, is_chief, epoch_log):
        super().__init__()
        self.spec, self.directory, self.monitor, self.is_chief, self.epoch_log = (
            spec, directory, monitor, is_chief, epoch_log)
        self.improves = better(mode)
        self.presets = getattr(spec, "saves_presets", False)  # a preset's task: saved as a preset directory
        self.entries = None  # the manifest: {"epoch" (from 1), "file", "logs"} per save
        self.best = None
        # The chief's copy of the model in the user's Keras lives on a thread of its own: callbacks run
        # inside the strategy's scope, which is per thread, and a variable made in that scope would be a
        # collective the other workers never join.
        self.keras_thread = None
        if is_chief and spec.flavor != "function" and not getattr(spec, "native", False):
            self.keras_thread = concurrent.futures.ThreadPoolExecutor(1, "tfbarrier-save")
        self.rebuilt = None  # that copy, built on the thread at the first save
        self.preprocessor = None  # a text fit's, which the model trains without (text.take_off): saved with it
        self.sharded = False  # each worker holds a shard of the optimizer's state: archives are saved without it

    def on_epoch_begin(self, epoch, logs=None):
        if self.entries is None:  # the first epoch of this attempt
            self.entries = self.restored(epoch)
            for logs in self.epoch_log.epochs[:epoch]:
                value = logs.get(self.monitor)
                if value is not None and (self.best is None or self.improves(value, self.best)):
                    self.best = value

    def restored(self, epoch):
        """The saves of the epochs before ``epoch`` (a resumed attempt's), from the manifest (chief)."""
        if not (epoch and self.is_chief):
            return []
        return [e for e in read_manifest(self.directory) if e["epoch"] <= epoch]

    def on_epoch_end(self, epoch, logs=None):
        logs = {k: float(v) for k, v in (logs or {}).items()}
        if self.monitor is not None and not self._improves(logs):
            return
        name = file_name(epoch, best=self.monitor is not None, preset=self.presets)
        with text.attached(self.model, self.preprocessor), optimizer_state_left_out(self.model, self.sharded):
            archive = None if self.presets else self._archive()
            if self.is_chief and self.presets:
                _write_preset(self.directory, name, self.model)
        if not self.is_chief:
            return
        if not self.presets:
            _write(self.directory, name, archive)
        self.entries.append({"epoch": epoch + 1, "file": name, "logs": logs})
        _write(self.directory, MANIFEST, json.dumps(self.entries, indent=1).encode())

    def on_train_end(self, logs=None):
        if self.keras_thread is not None:
            self.keras_thread.shutdown()

    def saved(self):
        """(epoch, file) of every save, this attempt's and the earlier ones' (chief)."""
        entries = self.entries if self.entries is not None else read_manifest(self.directory)  # no epoch left
        return [(e["epoch"], e["file"]) for e in entries]

    def _improves(self, logs):
        value = logs.get(self.monitor)
        if value is None:
            if self.monitor.startswith("val_") and not any(k.startswith("val_") for k in logs):
                return False  # an epoch without validation (validation_freq)
            raise ModelError(f"save_best={self.monitor!r} is not among the metrics of an epoch "
                             f"({', '.join(sorted(logs))}): pass one of them")
        if self.best is not None and not self.improves(value, self.best):
            return False
        self.best = value
        return True

    def _archive(self):
        if getattr(self.spec, "native", False):  # Keras 3 all along, and no read is a collective
            return save_archive(self.model) if self.is_chief else None
        if self.spec.flavor == "function":  # tf_keras all along: the trained model itself
            return save_archive(self.model)
        weights = self.model.get_weights()  # on every worker: the read may be a collective
        if not self.is_chief:
            return None
        return self.keras_thread.submit(self._archive_in_users_keras, weights).result()

    def _archive_in_users_keras(self, weights):
        if self.rebuilt is None:
            self.rebuilt = self.spec.rebuilt_in_users_keras()
        self.rebuilt.set_weights(weights)
        return save_archive(self.rebuilt)


def _write(directory, name, data):
    """``data`` as ``directory/name`` on any file system tf.io.gfile reaches: written aside, then renamed
    into place (atomic on local and POSIX file systems; object stores copy)."""
    path = os.path.join(directory, name)
    with atomic.written_aside(path, "wb", atomic.gfile(tf)) as f:
        f.write(data)


def _write_preset(directory, name, task):
    """The KerasHub ``task`` as the preset directory ``directory/name`` that ``from_preset`` loads, its LoRA
    adapters merged into the kernels they adapt (Keras saves a LoRA layer's kernel so): written in a local
    directory, copied beside its place on any file system tf.io.gfile reaches, then renamed into it (an
    earlier one of that name removed first)."""
    target = os.path.join(directory, name)
    scratch = f"{target}.part-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="tfbarrier-preset-") as local:
        task.save_to_preset(local)
        try:
            _copy_tree(local, scratch)
            if tf.io.gfile.exists(target):
                tf.io.gfile.rmtree(target)
            tf.io.gfile.rename(scratch, target)
        finally:
            if tf.io.gfile.exists(scratch):
                tf.io.gfile.rmtree(scratch)


def _copy_tree(source, target):
    for root, _, names in os.walk(source):
        into = os.path.join(target, os.path.relpath(root, source))
        tf.io.gfile.makedirs(into)
        for name in names:
            tf.io.gfile.copy(os.path.join(root, name), os.path.join(into, name), overwrite=True)
