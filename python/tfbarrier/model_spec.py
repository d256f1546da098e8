"""The model as bytes: made on the driver, rebuilt inside ``strategy.scope()`` in every worker.

A model reaches ``fit`` in one of two forms:

- a compiled Keras model object (Keras 3 or tf_keras): it travels as its JSON config, its compile
  config and its current weights, and is rebuilt with tf_keras in the worker (``keras_compat``);
  the trained weights come back into a clone of the user's model, in the user's Keras;
- a zero-argument function returning a compiled model: it travels cloudpickled and is called in the
  worker (where ``tf.keras`` is tf_keras); the trained model comes back as a tf_keras ``.keras`` archive.

Nothing here imports TensorFlow at module import time.
"""

import dataclasses
import hashlib
import os
import tempfile

import cloudpickle

from .errors import ModelError
from .job import pickle_user_code

FUNCTION_HINT = (
    "pass a function that builds and compiles the model instead, e.g. "
    "fit(df, lambda: build_model(), ...)"
)


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


def save_archive(model):
    """The model as ``.keras`` archive bytes (in its own Keras)."""
    with tempfile.TemporaryDirectory(prefix="tfbarrier-") as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def load_archive(archive, flavor):
    """A model from ``.keras`` archive bytes, loaded by the Keras that saved it."""
    with tempfile.TemporaryDirectory(prefix="tfbarrier-") as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(archive)
        return keras_module(flavor).models.load_model(path)


def weights_checksum(weights):
    """A hex digest of a model's weights, equal on two replicas only if every value is equal."""
    digest = hashlib.sha256()
    for w in weights:
        digest.update(w.tobytes())
    return digest.hexdigest()


@dataclasses.dataclass
class ModelSpec:
    """Everything a worker needs to rebuild the model. Plain data, pickled into the job."""

    flavor: str  # "keras3" / "tf_keras" for model objects, "function" for a builder function
    model_json: str = None
    compile_config: dict = None
    weights: list = None
    builder: bytes = None
    input_shape: tuple = None  # per-sample input shape, when known on the driver

    # ---- driver side -------------------------------------------------------------------------
    @classmethod
    def from_model(cls, model):
        flavor = keras_flavor(model)
        if flavor is not None:
            return cls._from_keras_object(model, flavor)
        if callable(model):
            try:
                return cls(flavor="function", builder=pickle_user_code(model, model))
            except Exception as exc:
                raise ModelError(
                    f"the model function cannot be pickled ({type(exc).__name__}: {exc}); define it at "
                    "module level or in __main__, without references to open files, sessions or locks"
                ) from exc
        raise ModelError(
            f"model must be a compiled Keras model or a function returning one, got {type(model).__name__}"
        )

    @classmethod
    def _from_keras_object(cls, model, flavor):
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
            spec = cls(
                flavor=flavor,
                model_json=model.to_json(),
                compile_config=model.get_compile_config(),
                weights=model.get_weights(),
                input_shape=tuple(input_shape[1:]),
            )
        except Exception as exc:
            raise ModelError(
                f"the model cannot be serialised through its config ({type(exc).__name__}: {exc}); "
                "subclassed models and custom layers cannot travel as a config: " + FUNCTION_HINT
            ) from exc
        return spec

    def check_loadable(self):
        """Build the worker's tf_keras model once on the driver, so an untranslatable model fails
        here instead of in every task. Skipped where tf_keras is not installed on the driver."""
        if self.flavor == "function":
            return
        try:
            import tf_keras  # noqa: F401
        except ImportError:
            return
        try:
            self._build_from_config()
        except Exception as exc:
            raise ModelError(
                f"the model's config cannot be loaded by tf_keras, which trains it on the workers "
                f"({type(exc).__name__}: {exc}); " + FUNCTION_HINT
            ) from exc

    def trained_model(self, original, weights, archive):
        """The trained model on the driver: a clone of ``original`` with the trained weights (same
        Keras as the user's), or the tf_keras model loaded from the chief's archive."""
        if self.flavor == "function":
            return load_archive(archive, "tf_keras")
        keras = keras_module(self.flavor)
        model = keras.models.clone_model(original)
        model.set_weights(weights)
        model.compile_from_config(original.get_compile_config())
        return model

    # ---- worker side (inside strategy.scope(), TF_USE_LEGACY_KERAS=1) -----------------------
    def build(self):
        """A compiled tf_keras model with the driver's initial weights (or the function's model)."""
        if self.flavor == "function":
            model = cloudpickle.loads(self.builder)()
            if getattr(model, "optimizer", None) is None:
                raise ModelError("the model function returned an uncompiled model: compile it before returning")
            if keras_flavor(model) != "tf_keras":
                raise ModelError(
                    "the model function built a Keras 3 model; inside tfbarrier workers build it with "
                    "tf.keras (tf_keras), e.g. `import tensorflow as tf; tf.keras.Sequential(...)`"
                )
            return model
        model = self._build_from_config()
        model.set_weights(self.weights)
        return model

    def _build_from_config(self):
        import json

        import tf_keras

        from . import keras_compat

        config = keras_compat.to_tf_keras(json.loads(self.model_json))
        model = tf_keras.models.model_from_json(json.dumps(config))
        model.compile(**keras_compat.compile_kwargs(self.compile_config))
        return model

    def rebuilt_in_users_keras(self):
        """The model in the user's Keras (Keras 3 or tf_keras) from its config, compiled as the user
        compiled it: what the chief saves for fit(save_to=) (not for a model function), built outside
        the strategy's scope."""
        model = keras_module(self.flavor).models.model_from_json(self.model_json)
        model.compile_from_config(self.compile_config)
        return model
