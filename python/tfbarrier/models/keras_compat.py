"""Translate Keras 3 model and compile configs into configs tf_keras can load.

Why: the Keras 3 that TensorFlow 2.21 installs cannot ``fit`` under MultiWorkerMirroredStrategy
(keras-team/keras #20585, #20329), so workers train with tf_keras. Users still build their model
with Keras 3; its config is rewritten here into the tf_keras dialect:

- serialized objects are mapped to the tf_keras class of the same name, keeping only the
  constructor arguments that class accepts (Keras 3 adds keys such as ``quantization_config``);
- dtype policies become plain dtype names; ``InputLayer(batch_shape=)`` becomes ``batch_input_shape``;
- functional graph nodes (``{"args": [...keras tensors...]}``) become tf_keras node lists.

Only built-in layers, optimizers, losses and metrics are covered: custom objects need a model
function (see ``tfbarrier.fit``). A config that is already in the tf_keras dialect passes through.
"""

import inspect

# Keyword arguments every tf_keras layer accepts through **kwargs.
_BASE_LAYER_KWARGS = frozenset({
    "name", "trainable", "dtype", "input_shape", "batch_input_shape", "batch_size", "input_dim",
    "activity_regularizer", "autocast", "dynamic",
})
_MODEL_CLASSES = frozenset({"Sequential", "Functional", "Model"})
_DTYPE_POLICIES = frozenset({"DTypePolicy", "FloatDTypePolicy"})


def _namespaces():
    import tf_keras

    return {
        "keras.layers": tf_keras.layers,
        "keras.initializers": tf_keras.initializers,
        "keras.regularizers": tf_keras.regularizers,
        "keras.constraints": tf_keras.constraints,
        "keras.optimizers": tf_keras.optimizers,
        "keras.losses": tf_keras.losses,
        "keras.metrics": tf_keras.metrics,
    }


def _accepted_kwargs(cls):
    params = inspect.signature(cls.__init__).parameters.values()
    names = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"self"}
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params)
    import tf_keras

    if takes_kwargs and issubclass(cls, tf_keras.layers.Layer):
        names |= _BASE_LAYER_KWARGS
    return names


def _keras_tensors(obj):
    """The ``keras_history`` of every Keras 3 tensor placeholder inside ``obj``, in order."""
    if isinstance(obj, dict):
        if obj.get("class_name") == "__keras_tensor__":
            return [obj["config"]["keras_history"]]
        return [h for value in obj.values() for h in _keras_tensors(value)]
    if isinstance(obj, list):
        return [h for value in obj for h in _keras_tensors(value)]
    return []


def _legacy_node(node):
    if isinstance(node, dict) and "args" in node:
        return [[*history, {}] for history in _keras_tensors(node["args"])]
    return node


def to_tf_keras(config, namespaces=None):
    """Return a copy of a Keras 3 serialized config (model, layer, optimizer, loss...) that tf_keras
    deserializes. Plain values and tf_keras-style configs are returned unchanged."""
    namespaces = namespaces or _namespaces()
    if isinstance(config, list):
        return [to_tf_keras(item, namespaces) for item in config]
    if not isinstance(config, dict):
        return config
    if config.get("module") == "keras" and config.get("class_name") in _DTYPE_POLICIES:
        return config["config"]["name"]
    out = {key: to_tf_keras(value, namespaces) for key, value in config.items()}
    class_name, inner = out.get("class_name"), out.get("config")
    if not (isinstance(class_name, str) and isinstance(inner, dict)):
        return out
    if "inbound_nodes" in out:
        out["inbound_nodes"] = [_legacy_node(node) for node in out["inbound_nodes"]]
    if class_name == "InputLayer" and "batch_shape" in inner:
        inner["batch_input_shape"] = inner.pop("batch_shape")
    namespace = namespaces.get(out.get("module"))
    cls = getattr(namespace, class_name, None) if namespace is not None else None
    if inspect.isclass(cls) and class_name not in _MODEL_CLASSES:
        accepted = _accepted_kwargs(cls)
        out["config"] = {key: value for key, value in inner.items() if key in accepted}
    out.pop("module", None)
    out.pop("registered_name", None)
    return out


ZEROS = {"class_name": "Zeros", "config": {}}


def zeros_initializers(config):
    """A copy of a tf_keras model config whose layers initialize every weight with zeros."""
    if isinstance(config, list):
        return [zeros_initializers(item) for item in config]
    if not isinstance(config, dict):
        return config
    return {key: ZEROS if key.endswith("_initializer") and value is not None else zeros_initializers(value)
            for key, value in config.items()}


def _deserialize(config, namespace_name, get):
    """An optimizer/loss/metric from a (translated) serialized form, or the plain string."""
    if config is None or isinstance(config, str):
        return config
    import tf_keras

    namespace = getattr(tf_keras, namespace_name)
    cls = getattr(namespace, config.get("class_name", ""), None)
    if inspect.isclass(cls):
        return cls.from_config(config["config"])
    return get(config)


def compile_kwargs(compile_config):
    """Keyword arguments for tf_keras ``Model.compile`` from a Keras 3 (or tf_keras) compile config."""
    import tf_keras

    cfg = to_tf_keras(compile_config)
    kwargs = {
        "optimizer": _deserialize(cfg.get("optimizer"), "optimizers", tf_keras.optimizers.get),
        "loss": _deserialize(cfg.get("loss"), "losses", tf_keras.losses.get),
    }
    for key in ("metrics", "weighted_metrics"):
        if cfg.get(key):
            kwargs[key] = [_deserialize(m, "metrics", tf_keras.metrics.get) for m in cfg[key]]
    if cfg.get("loss_weights") is not None:
        kwargs["loss_weights"] = cfg["loss_weights"]
    if isinstance(cfg.get("steps_per_execution"), int):
        kwargs["steps_per_execution"] = cfg["steps_per_execution"]
    if isinstance(cfg.get("jit_compile"), bool):  # Keras 3 may say "auto", which tf_keras does not know
        kwargs["jit_compile"] = cfg["jit_compile"]
    return kwargs
