"""A KerasHub preset loaded where it trains: ``fit(df, tfbarrier.preset(path, lora_rank=4))``.

The driver never builds the model: it reads the preset's ``task.json`` (which task class to load) and ships
the path, the LoRA rank and the user's ``prepare`` function (cloudpickled). Each training process loads the
task from the preset itself (``from_preset``), quantizes its backbone where asked (``quantize="int8"``: the frozen
weights held in int8, QLoRA's idea with Keras's own quantization), enables the adapters, calls ``prepare``
(compile, freeze) and trains natively (Keras 3). With adapters, only they come back: the chief writes ``save_lora_weights``'s file
and the driver holds it (``LoraAdapters``, a few MB) however large the backbone; without, the chief's ``.keras``
archive, the whole model.

Nothing here imports TensorFlow or Keras at module import time.
"""

import contextlib
import dataclasses
import json
import os
import socket
import tempfile

import cloudpickle

from tfbarrier.errors import InvalidArgumentError, ModelError
from tfbarrier.models import quantized
from tfbarrier.user_code import pickle_user_code

HUB_SCHEMES = ("hf", "kaggle", "modelscope")  # handles KerasHub downloads: hf://org/model, kaggle://org/model/keras/v/1
TASK_FILE = "task.json"  # KerasHub's: the task's class and config, written by save_to_preset
PREPROCESSOR_FILE = "preprocessor.json"  # KerasHub's too: the task's preprocessor, when it has one
PREPARE_FILE = "prepare.pkl"  # the user's prepare(model), cloudpickled
ADAPTERS_FILE = "adapters.lora.h5"  # the chief's trained adapters (save_lora_weights)
# In that file beside KerasHub's "lora" group: the task's other trainable weights, which save_lora_weights leaves
# out (the attention biases enable_lora leaves trainable, a classifier's head), one dataset each, by weight path.
OTHERS_GROUP = "tfbarrier_trained"


@dataclasses.dataclass(frozen=True)
class Preset:
    """What the user asks for: a KerasHub preset directory every executor can read (a local path on each
    host, or a file system TensorFlow reads), LoRA adapters of ``lora_rank`` (None: none), and ``prepare``, a
    function of the loaded model run before training (compile it, freeze layers); ``quantize``, the mode its
    backbone's weights are held in (None: as saved)."""

    path: str
    lora_rank: int = None
    prepare: object = None
    quantize: str = None


def preset(path, lora_rank=None, prepare=None, quantize=None):
    """A KerasHub preset for ``fit``'s ``model=``, loaded by the training processes, never by the driver: ``path``, a
    directory every executor reads, or a handle each downloads into its host's cache (``hf://org/model``,
    ``kaggle://...``, a built-in name).
    ``lora_rank``: enable LoRA adapters of that rank on the task's backbone (only they train and come back);
    ``prepare``: a function of the loaded model, called in each training process before training (e.g.
    ``lambda m: m.compile(optimizer=keras.optimizers.Adam(5e-5))``); without it the task keeps the compile
    KerasHub gave it.
    ``quantize``: ``"int8"`` or ``"int4"``: each training process quantizes the backbone's weights (Keras's
    ``quantize``) before it enables the adapters, which train in float over the frozen quantized weights (QLoRA's
    idea); needs ``lora_rank``. A preset saved already quantized (``task.quantize("int8")``, then
    ``task.save_to_preset``) loads as it is, never holding its float weights: the way to the smallest peak."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InvalidArgumentError(f"preset must be the path of a KerasHub preset directory or a handle "
                                   f"(hf://org/model), got {path!r}")
    if lora_rank is not None and (isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 1):
        raise InvalidArgumentError(f"lora_rank must be a positive integer (or None: no adapters), got {lora_rank!r}")
    if prepare is not None and not callable(prepare):
        raise InvalidArgumentError(f"prepare must be a function of the loaded model, got {type(prepare).__name__}")
    if quantize is not None and quantize not in quantized.MODES:
        raise InvalidArgumentError(f"quantize must be one of {', '.join(map(repr, quantized.MODES))} (or None: the "
                                   f"weights as saved), got {quantize!r}")
    if quantize is not None and lora_rank is None:
        raise InvalidArgumentError(f"quantize={quantize!r} freezes the backbone's weights in {quantize}: only LoRA "
                                   "adapters can train over them; give lora_rank (e.g. lora_rank=4)")
    return Preset(os.fspath(path), lora_rank, prepare, quantize)


def is_preset(model):
    """Whether ``model`` names a preset (a path, or ``preset(...)``): its model is not on the driver."""
    return isinstance(model, (str, os.PathLike, Preset))


def check_reads_text(model, column):
    """Refuse, on the driver where it sees the preset, a preset fit from the text column ``column`` whose task was
    saved without a preprocessor (no ``preprocessor.json``): nothing would turn the strings into token ids."""
    path = model.path if isinstance(model, Preset) else os.fspath(model)
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, PREPROCESSOR_FILE)):
        raise ModelError(f"feature column {column!r} holds strings, but the preset {path!r} has no "
                         f"{PREPROCESSOR_FILE} to tokenize them: save the task with its preprocessor "
                         "(task.save_to_preset), or tokenize the column into arrays of token ids first")


def task_class(path):
    """The registered name of the task class a preset directory saved (its ``task.json``), read on the driver
    where it can see the path; None where it cannot (a path only the executors have)."""
    task = os.path.join(path, TASK_FILE)
    if not os.path.isdir(path):
        return None
    if not os.path.exists(task):
        raise ModelError(f"the preset {path!r} has no {TASK_FILE}: it holds a backbone, not a task to train; save "
                         "the task (e.g. a CausalLM) with task.save_to_preset(path)")
    with open(task) as f:
        return json.load(f)["registered_name"]


@dataclasses.dataclass
class PresetModel:
    """The spec of a preset fit (in the job): the path, the task's class, the rank, the pickled ``prepare``."""

    path: str
    task: str = None  # the task class's registered name ("keras_hub>LlamaCausalLM"); None: read by the process
    lora_rank: int = None
    prepare: object = None  # transfer.Payload of PREPARE_FILE
    quantize: str = None
    # memory.ModelSize from the preset's weights files, where the driver sees them: a floor (what a step keeps, and
    # prepare's optimizer's slots, only the training process that loaded the task counts)
    size: object = None
    input_shape = None  # known once loaded
    adapters = ()
    flavor = "keras3"
    native = True
    saves_presets = True  # fit(save_to=) writes preset directories (saving.py)

    @classmethod
    def from_preset(cls, chosen, files):
        pickled = chosen.prepare and files.add_bytes(PREPARE_FILE, _pickled(chosen.prepare))
        return cls(chosen.path, task_class(chosen.path), chosen.lora_rank, pickled, chosen.quantize,
                   size=_size_of_files(chosen))

    # ---- in the training process ----
    def build(self, workdir):
        """The task loaded from the preset (its backbone quantized where asked), its adapters enabled, ``prepare``
        called; compiled."""
        loaded = load_task(self.path, self.task, self.quantize)
        if self.lora_rank:
            loaded.backbone.enable_lora(self.lora_rank)
        if self.prepare is not None:
            with open(self.prepare.path(workdir), "rb") as f:
                cloudpickle.load(f)(loaded)
        if getattr(loaded, "optimizer", None) is None:
            raise ModelError("the preset's task is not compiled: compile it in prepare=")
        return loaded

    @staticmethod
    def drawn_by_each_worker(model):
        """The variables each worker drew at random (the adapters; the preset's weights are the same
        everywhere): the chief's values go to every worker before the first step."""
        return model.trainable_weights

    def write_trained(self, model, workdir):
        """The chief's file for the driver: the adapters with LoRA, else the whole model's archive."""
        if self.lora_rank:
            write_adapters(model, os.path.join(workdir, ADAPTERS_FILE))
            return {"adapters": ADAPTERS_FILE}
        model.save(os.path.join(workdir, "trained.keras"))
        return {"archive": "trained.keras"}

    # ---- back on the driver ----
    def trained_model(self, original, path):
        """The adapters (``LoraAdapters``) with LoRA, else the whole trained model loaded from its archive."""
        if self.lora_rank:
            with open(path, "rb") as f:
                return LoraAdapters(self.path, self.task, self.lora_rank, f.read(), self.quantize)
        import keras
        import keras_hub  # noqa: F401

        return keras.saving.load_model(path)


@dataclasses.dataclass(frozen=True)
class LoraAdapters:
    """What a LoRA fit of a preset returns: the trained adapters (``save_lora_weights``'s file, as bytes), and
    the preset, rank and quantization they go on."""

    preset: str
    task: str
    rank: int
    weights: bytes
    quantize: str = None

    def save(self, path):
        """Write the adapters to ``path`` (a ``.lora.h5`` file KerasHub's ``load_lora_weights`` reads)."""
        with open(path, "wb") as f:
            f.write(self.weights)
        return path

    def load(self, weights=True):
        """The preset's task with these adapters: the whole model, loaded here (where the preset must be readable).
        ``weights=False``: its structure alone (the preset's weights left unread), for predict's checks on the
        driver, whose executors load the preset themselves."""
        with tempfile.TemporaryDirectory(prefix="tfbarrier-") as tmp:
            return task_with_adapters(self.preset, self.task, self.rank,
                                      self.save(os.path.join(tmp, ADAPTERS_FILE)) if weights else None, self.quantize)


def task_with_adapters(preset, task, rank, adapters_file=None, quantize=None):
    """The task of ``preset`` (its registered class name ``task``, None: read from the preset), quantized as
    ``quantize`` asks, with LoRA adapters of ``rank`` enabled and read from ``adapters_file``; None: with no file,
    nor the preset's weights read."""
    model = load_task(preset, task, quantize, load_weights=adapters_file is not None)
    model.backbone.enable_lora(rank)
    if adapters_file is not None:
        model.backbone.load_lora_weights(adapters_file)
        _read_others(model, adapters_file)
    return model


def load_task(path, task=None, quantize=None, load_weights=True):
    """The task of the preset at ``path``, its backbone's weights quantized to ``quantize`` (None: as saved), its
    quantized layers computing in float one at a time (quantized.py). A preset saved quantized loads so (Keras
    rebuilds its layers quantized): it is quantized again by no one, and refused where it holds another mode than
    ``quantize``."""
    with _downloading(path):
        model = task_of(path, task).from_preset(path, load_weights=load_weights)
    saved = quantized.mode_of(model.backbone)
    if quantize is not None and saved is None:
        quantized.quantize(model.backbone, quantize)
    elif quantize is not None and saved != quantize:
        raise ModelError(f"the preset {path!r} was saved quantized to {saved}, not {quantize}: give "
                         f"quantize={saved!r} (or None), or a preset saved in float")
    return quantized.compute_in_float(model)


def write_adapters(model, path):
    """Everything of the LoRA task ``model`` that trained, as ``path``: KerasHub's adapters file (what
    ``load_lora_weights`` reads), and in it the other trainable weights (OTHERS_GROUP), which it leaves out."""
    import h5py
    import numpy as np

    model.backbone.save_lora_weights(path)
    others = [w for w in model.trainable_weights if not w.path.rsplit("/", 1)[-1].startswith("lora_")]
    with h5py.File(path, "a") as f:
        group = f.create_group(OTHERS_GROUP)
        for index, weight in enumerate(others):
            group.create_dataset(str(index), data=np.asarray(weight.numpy(), np.float32)).attrs["path"] = weight.path


def _read_others(model, path):
    """Assign ``model`` the trainable weights write_adapters kept beside the adapters in ``path`` (none in a
    file KerasHub wrote)."""
    import h5py

    by_path = {weight.path: weight for weight in model.weights}
    with h5py.File(path, "r") as f:
        for data in f.get(OTHERS_GROUP, {}).values():
            weight = by_path.get(data.attrs["path"])
            if weight is None:
                raise ModelError(f"the adapters file {path!r} holds a trained weight {data.attrs['path']!r} that the "
                                 "preset's task does not have: load them on the task of the preset they trained on")
            weight.assign(data[()])


def task_of(path, task=None):
    """The task class of the preset at ``path`` (its registered name ``task``; None: read from its ``task.json``),
    refused in words where this host cannot read the preset."""
    import keras
    import keras_hub  # noqa: F401 - registers the tasks' classes

    if on_hub(path):
        if task is None:
            # KerasHub's own resolver of handles (built-in names too), into this host's cache of that hub
            from keras_hub.src.utils.preset_utils import get_file

            with open(get_file(path, TASK_FILE)) as f:
                task = json.load(f)["registered_name"]
        return keras.saving.get_registered_object(task)
    if not _readable(os.path.join(path, TASK_FILE)):
        raise ModelError(f"the preset {path!r} cannot be read on {socket.gethostname()}: every executor "
                         "must see it (a path on each host, or a file system TensorFlow reads: HDFS, S3)")
    if task is None:
        import tensorflow as tf

        task = json.loads(tf.io.gfile.GFile(os.path.join(path, TASK_FILE)).read())["registered_name"]
    return keras.saving.get_registered_object(task)


def on_hub(path):
    """Whether ``path`` is a handle KerasHub downloads (``hf://``, ``kaggle://``, ``modelscope://``, or the name of
    one of its built-in presets that is no directory here) rather than a directory to read."""
    if "://" in path:
        return path.split("://", 1)[0].lower() in HUB_SCHEMES
    if os.sep in path or os.path.exists(path):
        return False
    from keras_hub.src.utils.preset_utils import BUILTIN_PRESETS  # KerasHub's own list of them

    return path in BUILTIN_PRESETS


@contextlib.contextmanager
def _downloading(path):
    """A hub handle's failed download (no network, not in the cache, gated, no such preset), in words that name the
    handle, the host and the fix."""
    try:
        yield
    except ModelError:
        raise
    except Exception as exc:  # noqa: B902 - every hub client raises its own
        if not on_hub(path):
            raise
        raise ModelError(f"the preset {path!r} cannot be downloaded or loaded on {socket.gethostname()} "
                         f"({type(exc).__name__}: {exc}): every executor must reach its hub or find it in its cache "
                         "(HF_HUB_CACHE, KAGGLEHUB_CACHE), or give a directory every executor reads") from exc


def _size_of_files(chosen):
    """The memory.ModelSize the driver can tell of ``chosen`` without loading it: its weights as large as its
    weights files (``*.weights.h5``: as the task loads them, in their own dtype), all of them trainable without
    adapters; None where the driver cannot list the preset (a path only the executors have)."""
    from tfbarrier.models import memory

    if not os.path.isdir(chosen.path):
        return None
    weights = sum(entry.stat().st_size for entry in os.scandir(chosen.path) if entry.name.endswith(".weights.h5"))
    return memory.ModelSize(weights=weights, trainable=0 if chosen.lora_rank else weights, slots=0,
                            optimizer="prepare's optimizer", native=True)


def _readable(path):
    if os.path.exists(path):
        return True
    if "://" not in path:
        return False
    import tensorflow as tf

    return tf.io.gfile.exists(path)


def _pickled(prepare):
    try:
        return pickle_user_code(prepare, prepare)
    except Exception as exc:
        raise ModelError(f"prepare cannot be pickled ({type(exc).__name__}: {exc}); define it at module level, "
                         "without references to open files or sessions") from exc
