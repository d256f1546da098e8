"""fit(save_to=dir): the chief writes the model to ``dir`` while it trains, so a long job leaves
usable models behind even if the driver dies.

Each save is a ``.keras`` archive in the user's Keras, the archive ``FitResult.save`` writes: a
Keras model passed to fit is rebuilt in its own Keras (Keras 3 or tf_keras) from its config with the
trained weights, since a tf_keras archive does not load in Keras 3; a model function's tf_keras model
is saved as it is. Every completed epoch is kept (``epoch-001.keras``, ...) or, with ``save_best``, only
the best one by that metric so far (``best.keras``). ``saved.json`` lists what was written, with each
epoch's logs; a resumed attempt carries it on. Files are written aside and renamed into place: on a
local or POSIX file system a reader never sees half an archive.
"""

import concurrent.futures
import json
import os

from .errors import InvalidArgumentError, ModelError
from .model_spec import save_archive

MANIFEST = "saved.json"
HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall")  # in a metric's name: "auto" mode maximises it


def best_mode(monitor, mode, argument="save_mode"):
    """"min" or "max": ``mode`` itself, or for "auto" "max" when the metric's name has one of
    HIGHER_IS_BETTER (as Keras's ModelCheckpoint decides for accuracies), else "min"."""
    if mode not in ("auto", "min", "max"):
        raise InvalidArgumentError(f"{argument} must be 'auto', 'min' or 'max', got {mode!r}")
    if mode != "auto":
        return mode
    return "max" if any(word in monitor for word in HIGHER_IS_BETTER) else "min"


def better(mode):
    """A function telling whether a metric's value improves on another in ``mode`` ("min" or "max")."""
    return (lambda a, b: a < b) if mode == "min" else (lambda a, b: a > b)


def file_name(epoch, best):
    """The archive of ``epoch`` (from 0)."""
    return "best.keras" if best else f"epoch-{epoch + 1:03d}.keras"


def read_manifest(directory):
    """The entries of ``directory``'s saved.json, oldest first ([] when there is none)."""
    import tensorflow as tf

    path = os.path.join(directory, MANIFEST)
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def save_callback(spec, directory, monitor, mode, is_chief, epoch_log):
    """A Keras callback saving the model after each epoch (or each improvement of ``monitor``) to
    ``directory``. Reading the weights may be a collective (variables summed on read), so every worker
    reads them at the same epochs: the decision rests on the epoch's logs, the same on every worker,
    and on a resumed attempt on the restored epochs' logs (``epoch_log``, which runs before). Only the
    chief writes."""
    import tf_keras

    improves = better(mode)
    # The chief's copy of the model in the user's Keras lives on a thread of its own: callbacks run
    # inside the strategy's scope, which is per thread, and a variable made in that scope would be a
    # collective the other workers never join.
    keras_thread = None
    if is_chief and spec.flavor != "function":
        keras_thread = concurrent.futures.ThreadPoolExecutor(1, "tfbarrier-save")
    rebuilt = []

    def archive_in_users_keras(weights):
        if not rebuilt:
            rebuilt.append(spec.rebuilt_in_users_keras())
        rebuilt[0].set_weights(weights)
        return save_archive(rebuilt[0])

    class SaveModel(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.entries = None  # the manifest: {"epoch" (from 1), "file", "logs"} per save
            self.best = None

        def on_epoch_begin(self, epoch, logs=None):
            if self.entries is None:  # the first epoch of this attempt
                self.entries = self.restored(epoch)
                for logs in epoch_log.epochs[:epoch]:
                    if logs.get(monitor) is not None and (self.best is None or improves(logs[monitor], self.best)):
                        self.best = logs[monitor]

        def restored(self, epoch):
            """The saves of the epochs before ``epoch`` (a resumed attempt's), from the manifest (chief)."""
            return [e for e in read_manifest(directory) if e["epoch"] <= epoch] if epoch and is_chief else []

        def on_epoch_end(self, epoch, logs=None):
            logs = {k: float(v) for k, v in (logs or {}).items()}
            if monitor is not None and not self._improves(logs):
                return
            archive = self._archive()
            if not is_chief:
                return
            name = file_name(epoch, best=monitor is not None)
            _write(directory, name, archive)
            self.entries.append({"epoch": epoch + 1, "file": name, "logs": logs})
            _write(directory, MANIFEST, json.dumps(self.entries, indent=1).encode())

        def on_train_end(self, logs=None):
            if keras_thread is not None:
                keras_thread.shutdown()

        def _improves(self, logs):
            value = logs.get(monitor)
            if value is None:
                if monitor.startswith("val_") and not any(k.startswith("val_") for k in logs):
                    return False  # an epoch without validation (validation_freq)
                raise ModelError(f"save_best={monitor!r} is not among the metrics of an epoch "
                                 f"({', '.join(sorted(logs))}): pass one of them")
            if self.best is not None and not improves(value, self.best):
                return False
            self.best = value
            return True

        def _archive(self):
            if spec.flavor == "function":  # tf_keras all along: the trained model itself
                return save_archive(self.model)
            weights = self.model.get_weights()
            return keras_thread.submit(archive_in_users_keras, weights).result() if is_chief else None

        def saved(self):
            """(epoch, file) of every save, this attempt's and the earlier ones' (chief)."""
            entries = self.entries if self.entries is not None else read_manifest(directory)  # no epoch left to run
            return [(e["epoch"], e["file"]) for e in entries]

    return SaveModel()


def _write(directory, name, data):
    """``data`` as ``directory/name`` on any file system tf.io.gfile reaches: written aside, then renamed
    into place (atomic on local and POSIX file systems; object stores copy)."""
    import tensorflow as tf

    path = os.path.join(directory, name)
    with tf.io.gfile.GFile(path + ".tmp", "wb") as f:
        f.write(data)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
