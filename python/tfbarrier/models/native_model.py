"""A Keras 3 model that trains as it is, in Keras 3 ("native"), instead of translated into tf_keras.

The path a Keras 3 model object takes is chosen on the driver (``spec_for_fit``): translated when
tf_keras can rebuild it (model_spec.py), native when it cannot (a custom layer, a subclassed model), or
as ``spark.tfbarrier.keras3Training`` says ("translated", "native"; "auto" by default). Either trains
over tfbarrier's ring (fitting/training_loop.py) unless a translated fit asks for the strategy.

A native model travels as its ``.keras`` archive (config, compile config, weights, optimizer state)
and the user's own objects the archive names (custom layers, a subclassed model's class, a loss
function), cloudpickled: the training processes cannot import a script's classes. It trains over
tfbarrier's ring (fitting/training_loop.py); the chief's trained archive comes back and is loaded with the same objects.

Nothing here imports TensorFlow or Keras at module import time.
"""

import dataclasses
import json
import os
import tempfile
import zipfile

import cloudpickle

from tfbarrier import atomic
from tfbarrier.errors import InvalidArgumentError, ModelError
from tfbarrier.keras_helpers import unbuilt_optimizer_unwarned
from tfbarrier.models import quantized
from tfbarrier.models.model_spec import ModelSpec, keras_flavor, save_archive
from tfbarrier.models.weights_file import read_weights
from tfbarrier.user_code import pickle_user_code

ARCHIVE_FILE = "model.keras"  # the model as the driver sends it
OBJECTS_FILE = "custom-objects.pkl"  # {name: the user's class or function}, cloudpickled
PATHS = ("auto", "native", "translated")
NOT_YET = "for a Keras 3 model that trains natively (custom layers, subclassed models) tfbarrier does not " \
          "support {what} yet: {fix}"


def spec_for_fit(model, files, path="auto", named=False):
    """The spec of the model ``fit`` got, its files added to ``files``: a NativeModel for a Keras 3
    model object that trains natively (always, with inputs or outputs ``named`` by features= or label=),
    else a ModelSpec checked to rebuild in tf_keras."""
    from tfbarrier.models import presets

    if isinstance(model, (str, os.PathLike)):
        model = presets.preset(model)
    if isinstance(model, presets.Preset):  # loaded by the training processes, never here
        return presets.PresetModel.from_preset(model, files)
    path = str(path).strip().lower()
    if path not in PATHS:
        raise InvalidArgumentError(f"spark.tfbarrier.keras3Training is {path!r}: set it to one of {', '.join(PATHS)}")
    if named and (keras_flavor(model) != "keras3" or path == "translated"):
        raise ModelError("features= or label= as a dict (one column per model input or output) needs a Keras 3 "
                         "model that trains natively: build it with keras (Keras 3), and leave "
                         "spark.tfbarrier.keras3Training at auto")
    if keras_flavor(model) == "keras3" and path != "translated":
        if path == "native" or named or ModelSpec.untranslatable(model) is not None:
            return NativeModel.from_model(model, files)
        return ModelSpec.from_model(model, files)  # untranslatable() checked it
    spec = ModelSpec.from_model(model, files)
    spec.check_loadable()
    return spec


def check_options(**options):
    """Refuse, on the driver, a fit option the native path does not have yet (``options``: name to
    (value given, what to do instead))."""
    for name, (value, fix) in options.items():
        if value:
            raise InvalidArgumentError(NOT_YET.format(what=name, fix=fix))


def _keras_own(obj):
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in ("keras", "keras_hub", "tf_keras", "tensorflow", "builtins", "numpy")


def _compiled_objects(model):
    """The loss, metrics and optimizer ``model`` was compiled with (and its learning rate's schedule):
    functions, classes and their instances."""
    metrics = getattr(model, "_compile_metrics", None)
    optimizer = getattr(model, "optimizer", None)
    found, pending = [], [getattr(model, "loss", None), getattr(metrics, "_user_metrics", None),
                          getattr(metrics, "_user_weighted_metrics", None), optimizer,
                          getattr(optimizer, "_learning_rate", None)]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif item is not None and not isinstance(item, (str, int, float)):
            found.append(item if isinstance(item, type) or hasattr(item, "__code__") else type(item))
    return found


def _registered_and_named(model):
    """The objects registered with ``keras.saving.register_keras_serializable`` whose name ``model``'s
    config or compile config uses (KerasHub registers hundreds: the executors need import only these)."""
    import json

    import keras

    registered = keras.saving.get_custom_objects()
    try:
        text = model.to_json() + json.dumps(model.get_compile_config(), default=str)
    except Exception:  # noqa: B902 - a config that does not serialise: ship them all
        return dict(registered)
    return {name: obj for name, obj in registered.items() if f'"{name}"' in text}


def custom_objects(model):
    """{name the archive uses: object} for every class and function of the user's own that
    ``model``'s archive names (its layers' and its own classes, its loss, metrics and optimizer), and
    those registered with ``keras.saving.register_keras_serializable`` that it names."""
    import keras

    objects = _registered_and_named(model)
    candidates = [type(layer) for layer in model._flatten_layers(include_self=True)] + _compiled_objects(model)
    for obj in candidates:
        if not _keras_own(obj):
            objects[keras.saving.get_registered_name(obj)] = obj
            objects[obj.__name__] = obj
    return objects


def pickled_custom_objects(model):
    """``custom_objects(model)``, cloudpickled: the user's own modules go by value (user_code.py)."""
    objects = custom_objects(model)
    try:
        return pickle_user_code(objects, *objects.values())
    except Exception as exc:
        raise ModelError(f"the model's own classes and functions cannot be pickled ({type(exc).__name__}: "
                         f"{exc}); define them at module level, without references to open files or sessions") from exc


def input_shape_of(model):
    """The per-sample shape of the model's input, or {input name: shape} for a model of several inputs
    (keras.Input's names); None when unknown (a subclassed model not yet called, or called on a dict)."""
    try:
        inputs = list(model.inputs)
    except (AttributeError, ValueError, TypeError):  # a subclassed model has no symbolic inputs
        inputs = []
    if len(inputs) > 1:
        return {tensor.name: tuple(tensor.shape[1:]) for tensor in inputs}
    try:
        shape = model.input_shape
    except (AttributeError, ValueError):  # a subclassed model has no symbolic input: the shape it was built for
        built = getattr(model, "_build_shapes_dict", None) or {}
        shape = next(iter(built.values())) if len(built) == 1 else None
    if shape is None:
        return None
    if not isinstance(shape, tuple) or (shape and isinstance(shape[0], (tuple, list))):
        return None
    return tuple(shape[1:])


@dataclasses.dataclass
class NativeModel:
    """A Keras 3 model as a ``.keras`` archive and its custom objects (transfer.Payloads)."""

    archive: object = None
    objects: object = None
    input_shape: tuple = None
    size: object = None  # memory.ModelSize
    adapters: tuple = ()  # Adapters of each LoRA-enabled KerasHub backbone, which its archive does not keep
    frozen: frozenset = frozenset()  # the paths of the weights that do not train (a flag no archive keeps)
    flavor = "keras3"
    native = True

    @classmethod
    def from_model(cls, model, files):
        from tfbarrier.models import memory

        if getattr(model, "optimizer", None) is None:
            raise ModelError("the model is not compiled: call model.compile(optimizer=..., loss=..., metrics=...) "
                             "before fit()")
        if not model.weights:
            raise ModelError("the model has no weights yet (a subclassed model makes them when first called): "
                             "call it once on a batch, e.g. model(x[:1]), or model.build(input_shape), before fit()")
        adapters = Adapters.of(model, files)
        input_shape = input_shape_of(model)
        pickled = pickled_custom_objects(model)
        return cls(archive=files.add_bytes(ARCHIVE_FILE, save_archive(model)), objects=files.add_bytes(OBJECTS_FILE, pickled),
                   input_shape=input_shape, size=memory.ModelSize.of(model, native=True), adapters=adapters,
                   frozen=frozenset(v.path for v in model.weights if not v.trainable))

    def build(self, workdir):
        """The compiled Keras 3 model in a training process, with the driver's weights (and adapters), the
        driver's frozen weights frozen: before its optimizer makes slots for them."""
        with open(self.objects.path(workdir), "rb") as f:
            objects = cloudpickle.load(f)
        # a model its user quantized dequantizes one layer at a time, never every layer's float weights at once
        return quantized.one_layer_at_a_time(self._restored(load_archive(self.archive.path(workdir), objects), workdir))

    def _restored(self, model, workdir=None):
        """``model`` with the driver's adapters (their values from ``workdir``; None: enabled only) and frozen
        weights."""
        layers = list(model._flatten_layers(include_self=True))
        for adapters in self.adapters:
            adapters.restore(layers[adapters.index], workdir)
        for variable in model.weights:
            if variable.path in self.frozen:
                variable.trainable = False
        return model

    @staticmethod
    def drawn_by_each_worker(model):
        """None: every weight (adapters included) comes from the driver's archive, the same everywhere."""
        return ()

    def trained_model(self, original, path):
        """The trained model on the driver: the chief's archive at ``path``, loaded with ``original``'s
        custom objects; with adapters, ``original`` copied (adapters restored) and the chief's weights file at
        ``path`` read into it."""
        if not self.adapters:
            return load_archive(path, custom_objects(original))
        with tempfile.TemporaryDirectory(prefix="tfbarrier-") as tmp:
            copy = os.path.join(tmp, ARCHIVE_FILE)
            with atomic.private_file(copy) as f:
                f.write(save_archive(original))
            model = self._restored(load_archive(copy, custom_objects(original)))
        read_weights(path, model.weights)
        return model


@dataclasses.dataclass(frozen=True)
class Adapters:
    """A LoRA-enabled KerasHub backbone's adapters: where it is among the model's layers (``index``), its
    rank, the layers it enabled them on, and their weights (``save_lora_weights``'s file, a payload)."""

    index: int
    rank: int
    targets: tuple
    weights: object

    @classmethod
    def of(cls, model, files):
        """The adapters of each LoRA-enabled backbone in ``model``, their weights added to ``files``."""
        found = []
        for index, layer in enumerate(model._flatten_layers(include_self=True)):
            enabled = getattr(layer, "_lora_enabled_layers", None)
            if not enabled:
                continue
            with_weights = [inner for inner in layer._flatten_layers(include_self=False) if inner.weights]
            with tempfile.TemporaryDirectory(prefix="tfbarrier-") as tmp:
                path = os.path.join(tmp, f"adapters-{index}.lora.h5")
                layer.save_lora_weights(path)
                with open(path, "rb") as f:
                    payload = files.add_bytes(os.path.basename(path), f.read())
            found.append(cls(index, layer._lora_rank, tuple(dict.fromkeys(with_weights[i].name for i in enabled)),
                             payload))
        return tuple(found)

    def restore(self, backbone, workdir=None):
        """Enable the adapters on ``backbone`` (a copy of the model's) and load the driver's values from
        ``workdir`` (None: enabled only, their values read later)."""
        backbone.enable_lora(self.rank, target_layer_names=list(self.targets))
        if workdir is not None:
            backbone.load_lora_weights(self.weights.path(workdir))


def load_archive(path, objects):
    """A ``.keras`` archive loaded by Keras 3 with ``objects``, from its files unpacked beside it: from an archive,
    Keras reads the weights file whole into memory before it loads it (the weights held twice at the load's peak),
    from a directory in place, a variable at a time. An unbuilt optimizer's archive holds none of its variables,
    which Keras warns about (nothing is lost: they start at zero)."""
    import warnings

    import keras

    with unbuilt_optimizer_unwarned(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`compile\(\)` was not called as part of model loading")
        model = _load_unpacked(os.fspath(path), objects)
    if type(model).compile is not keras.Model.compile:
        _compile_as_saved(model, path, objects)
    return model


def _load_unpacked(path, objects):
    import keras

    with tempfile.TemporaryDirectory(prefix="unpacked-", dir=os.path.dirname(path) or None) as directory:
        with zipfile.ZipFile(path) as archive:
            archive.extractall(directory)
        try:
            return keras.saving.load_model(directory, custom_objects=objects, compile=True)
        except ValueError as exc:  # a Keras that loads archives only
            if "Invalid filename" not in str(exc):
                raise
    return keras.saving.load_model(path, custom_objects=objects, compile=True)


def _compile_as_saved(model, path, objects):
    """Compile ``model``, loaded from the archive at ``path``, as the archive says it was compiled, its optimizer's
    saved variables restored: Keras skips both for a model whose class overrides ``compile`` (every KerasHub task,
    which its own constructor compiles with its defaults: Adam, whatever the user chose)."""
    import h5py
    import keras

    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json")).get("compile_config")
        if not config:
            return
        with keras.saving.custom_object_scope(objects or {}):
            model.compile(**keras.saving.deserialize_keras_object(config))
        # read in place: only the optimizer's variables, never the model's weights a second time
        with archive.open("model.weights.h5") as weights, h5py.File(weights, "r") as store:
            saved = store.get("optimizer/vars")
            values = [saved[str(i)][()] for i in range(len(saved))] if saved is not None else []
    if len(values) > len(model.optimizer.variables):  # the driver's optimizer was built: it has slots
        model.optimizer.build(model.trainable_variables)
    if len(values) == len(model.optimizer.variables):
        for variable, value in zip(model.optimizer.variables, values):
            variable.assign(value)
