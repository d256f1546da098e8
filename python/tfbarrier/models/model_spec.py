"""The model as files: made on the driver, rebuilt inside ``strategy.scope()`` in every worker.

A model reaches ``fit`` in one of two forms:

- a compiled Keras model object (Keras 3 or tf_keras): it travels as its JSON config, its compile
  config and a file of its current weights, and is rebuilt with tf_keras in the worker
  (``keras_compat``); the chief's trained weights come back in a file of the same kind, loaded into a
  clone of the user's model, in the user's Keras;
- a zero-argument function returning a compiled model: it travels cloudpickled, as a file, and is
  called in the worker (where ``tf.keras`` is tf_keras); the trained model comes back as the chief's
  tf_keras ``.keras`` archive.

The files are transfer.Payloads: they go to the tasks outside Spark (transfer.py); the weights in a
weights file (weights_file.py), written and read a variable at a time.

Nothing here imports TensorFlow at module import time.
"""

import dataclasses
import json
import os
import tempfile
import zipfile

import cloudpickle

from tfbarrier.errors import ModelError
from tfbarrier.keras_helpers import initial_values_local, unbuilt_optimizer_unwarned
from tfbarrier.models import keras_compat
from tfbarrier.models.weights_file import FUNCTION_HINT, read_weights, tf_variable, write_weights
from tfbarrier.user_code import pickle_user_code

WEIGHTS_FILE = "model.safetensors"  # the model's weights, as the driver sends them
BUILDER_FILE = "model-function.pkl"  # the model function, cloudpickled


def keras_flavor(model):
    """"keras3" or "tf_keras" for a Keras model object, None for anything else."""
    for cls in type(model).__mro__:
        module = cls.__module__ or ""
        if module.startswith("tf_keras"):
            return "tf_keras"
        if module.startswith("keras"):
            return "keras3"
    return None


def keras_module(flavor):
    """The module of Keras ``flavor``: keras (Keras 3) or tf_keras."""
    if flavor == "tf_keras":
        import tf_keras

        return tf_keras
    import keras

    return keras


def _archive_flavor(path):
    """The Keras that wrote the ``.keras`` archive at ``path``: "keras3" or "tf_keras" (its metadata's version)."""
    with zipfile.ZipFile(path) as archive:
        version = json.loads(archive.read("metadata.json"))["keras_version"]
    return "keras3" if int(version.split(".")[0]) >= 3 else "tf_keras"


def save_archive(model):
    """The model as ``.keras`` archive bytes (in its own Keras); a ModelError in words when it cannot be saved (a
    custom layer, or a preprocessor's, without a get_config() that Keras can write)."""
    with tempfile.TemporaryDirectory(prefix="tfbarrier-") as tmp:
        path = os.path.join(tmp, "model.keras")
        try:
            model.save(path)
        except Exception as exc:
            raise ModelError(f"the model cannot be saved as a .keras archive ({type(exc).__name__}: {exc}), so it "
                             "cannot travel to the executors: give its custom layers and models (a preprocessor's "
                             "too) a get_config() of plain values (Keras's guide 'Save, serialize, and export "
                             "models')") from exc
        with open(path, "rb") as f:
            return f.read()


def archive_digest(archive):
    """A hex digest of a ``.keras`` archive's model: every member's name and bytes but metadata.json's (the Keras
    version and the second it was saved), so that one model saved twice has one digest."""
    import hashlib
    import io
    import zipfile

    digest = hashlib.sha256()
    with zipfile.ZipFile(io.BytesIO(archive)) as members:
        for name in sorted(members.namelist()):
            if name != "metadata.json":
                digest.update(f"{name}\0{members.getinfo(name).file_size}\0".encode())
                digest.update(members.read(name))
    return digest.hexdigest()


def _with_zeros(layer):
    """A copy of ``layer`` whose weights start as zeros: read_weights overwrites them all, and the
    layers' own initializers' temporaries (twice the weights) would stay in TensorFlow's allocator."""
    return layer.__class__.from_config(keras_compat.zeros_initializers(layer.get_config()))


@dataclasses.dataclass
class ModelSpec:
    """Everything a worker needs to rebuild the model: plain data and Payloads, pickled into the job."""

    flavor: str  # "keras3" / "tf_keras" for model objects, "function" for a builder function
    model_json: str = None
    compile_config: dict = None
    weights: object = None  # transfer.Payload of WEIGHTS_FILE
    builder: object = None  # transfer.Payload of BUILDER_FILE
    input_shape: tuple = None  # per-sample input shape, when known on the driver
    size: object = None  # memory.ModelSize: what the model takes in a worker, when known on the driver
    native = False  # trains in tf_keras

    # ---- driver side -------------------------------------------------------------------------
    @classmethod
    def from_model(cls, model, files):
        """The spec of ``model``, its files added to ``files`` (a transfer.JobFiles)."""
        flavor = keras_flavor(model)
        if flavor is not None:
            return cls._from_keras_object(model, flavor, files)
        if callable(model):
            try:
                builder = pickle_user_code(model, model)
            except Exception as exc:
                raise ModelError(
                    f"the model function cannot be pickled ({type(exc).__name__}: {exc}); define it at "
                    "module level or in __main__, without references to open files, sessions or locks"
                ) from exc
            return cls(flavor="function", builder=files.add_bytes(BUILDER_FILE, builder))
        raise ModelError(
            f"model must be a compiled Keras model or a function returning one, got {type(model).__name__}"
        )

    @classmethod
    def _from_keras_object(cls, model, flavor, files):
        from tfbarrier.models import memory

        config = cls._config_of(model)
        return cls(flavor=flavor, **config, weights=files.add(WEIGHTS_FILE, lambda path: write_weights(model.weights, path)),
                   size=memory.ModelSize.of(model))

    @staticmethod
    def _config_of(model):
        """{model_json, compile_config, input_shape} of a Keras model object; ModelError when it has
        no compile config, several inputs, or no config."""
        if getattr(model, "optimizer", None) is None:
            raise ModelError(
                "the model is not compiled: call model.compile(optimizer=..., loss=..., metrics=...) "
                "before fit()"
            )
        input_shape = getattr(model, "input_shape", None)
        if isinstance(input_shape, list) or not isinstance(input_shape, tuple):
            raise ModelError(
                f"only models with one input tensor are supported (input shape {input_shape!r}); "
                + FUNCTION_HINT
            )
        try:
            model_json, compile_config = model.to_json(), model.get_compile_config()
        except Exception as exc:
            raise ModelError(
                f"the model cannot be serialised through its config ({type(exc).__name__}: {exc}); "
                "subclassed models and custom layers cannot travel as a config: " + FUNCTION_HINT
            ) from exc
        return {"model_json": model_json, "compile_config": compile_config, "input_shape": tuple(input_shape[1:])}

    @classmethod
    def untranslatable(cls, model):
        """Why tf_keras cannot rebuild the Keras 3 model object ``model`` (a ModelError), or None."""
        try:
            cls(flavor="keras3", **cls._config_of(model)).check_loadable()
        except ModelError as exc:
            return exc
        except Exception as exc:  # noqa: B902 - a subclassed model's input_shape may raise anything
            return ModelError(f"{type(exc).__name__}: {exc}")
        return None

    def check_loadable(self):
        """Build the worker's tf_keras model once on the driver, so an untranslatable model fails
        here instead of in every task. It is built in a graph of its own, which allocates no weights.
        Skipped where tf_keras is not installed on the driver."""
        if self.flavor == "function":
            return
        try:
            import tensorflow as tf
            import tf_keras  # noqa: F401
        except ImportError:
            return
        logger, level = tf.get_logger(), tf.get_logger().level
        logger.setLevel("ERROR")  # graph mode's deprecation notices
        try:
            with tf.Graph().as_default():
                self._model_from_config()
            keras_compat.compile_kwargs(self.compile_config)
        except Exception as exc:
            raise ModelError(
                f"the model's config cannot be loaded by tf_keras, which trains it on the workers "
                f"({type(exc).__name__}: {exc}); " + FUNCTION_HINT
            ) from exc
        finally:
            logger.setLevel(level)

    def trained_model(self, original, path):
        """The trained model on the driver from the chief's file at ``path``: a clone of ``original``
        with the trained weights (same Keras as the user's), or the model of the chief's archive (a model
        function's, in the Keras it built it with)."""
        if self.flavor == "function":  # the archive of what it built: tf_keras's, or Keras 3's
            with unbuilt_optimizer_unwarned():  # its optimizer saved unbuilt (training.save_archive)
                return keras_module(_archive_flavor(path)).models.load_model(path)
        keras = keras_module(self.flavor)
        model = keras.models.clone_model(original, clone_function=_with_zeros)
        read_weights(path, model.weights, lambda variable: [tf_variable(variable)])
        # As the user compiled it, with a fresh optimizer whose slots are made when it first trains:
        # compile_from_config would build them now (zeros: two more copies of the weights for Adam).
        model.compile(**keras.saving.deserialize_keras_object(original.get_compile_config()))
        return model

    # ---- worker side (inside strategy.scope(), TF_USE_LEGACY_KERAS=1) -----------------------
    def drawn_by_each_worker(self, model):
        """The variables each worker drew itself: a model function's every weight (with no seed, each
        worker its own), none of a model whose weights the driver sent."""
        return model.weights if self.flavor == "function" else ()

    def build(self, workdir, strategy=None):
        """A compiled tf_keras model with the driver's initial weights (or the function's model); the
        payloads are in ``workdir``. ``strategy``: the distribution strategy whose local copies of each
        variable get the weights."""
        if self.flavor == "function":
            with open(self.builder.path(workdir), "rb") as f:
                model = cloudpickle.load(f)()
            if getattr(model, "optimizer", None) is None:
                raise ModelError("the model function returned an uncompiled model: compile it before returning")
            if strategy is not None and keras_flavor(model) != "tf_keras":
                raise ModelError(
                    "the model function built a Keras 3 model, which MultiWorkerMirroredStrategy cannot train: pass "
                    "exchange=\"tfbarrier\" (its ring trains it natively; \"auto\" picks the strategy for several "
                    "GPUs a worker), or build it with tf.keras (tf_keras)")
            return model  # a Keras 3 one trains natively over the ring
        local = strategy.experimental_local_results if strategy is not None else (lambda variable: [variable])
        with initial_values_local(strategy):  # every worker reads the same weights next
            # Zeros, not the layers' initializers: read_weights overwrites every weight, and a random
            # initializer's temporaries (twice the weights) would stay in TensorFlow's allocator.
            model = self._model_from_config(zeros=True)
            model.compile(**keras_compat.compile_kwargs(self.compile_config))
            read_weights(self.weights.path(workdir), model.weights, local)
        return model

    def _model_from_config(self, zeros=False):
        import tf_keras

        config = keras_compat.to_tf_keras(json.loads(self.model_json))
        if zeros:
            config = keras_compat.zeros_initializers(config)
        return tf_keras.models.model_from_json(json.dumps(config))

    def rebuilt_in_users_keras(self):
        """The model in the user's Keras (Keras 3 or tf_keras) from its config, compiled as the user
        compiled it: what the chief saves for fit(save_to=) (not for a model function), built outside
        the strategy's scope."""
        model = keras_module(self.flavor).models.model_from_json(self.model_json)
        model.compile_from_config(self.compile_config)
        return model
