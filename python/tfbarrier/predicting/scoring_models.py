"""How a model reaches predict's executors, and is loaded there once per Python worker.

The model travels as its config and a weights file (model_spec.py), or a Keras 3 model with state in assets (a
preprocessor's tokenizer vocabulary, data/text.py; an adapted lookup layer's) as its ``.keras`` archive, or a
preset's LoRA fit as its adapters alone (each executor loads the preset itself, presets.py), named by a
digest of its content; the driver serves it for as
long as it runs (transfer.session_server): each executor host fetches the file once into its
temporary directory (the last MODELS_KEPT of them are kept), outside Spark's JVM, and each Spark Python
worker rebuilds the model once and keeps the last _CACHE_SIZE. Where Spark encrypts its traffic, so does
the link (TLS, tls.py). Where the driver cannot serve files (``spark.tfbarrier.driverLink=false``, or it
cannot listen on its address), or the session is attached to another program's JVM (attachment.py: that program computes the
predictions, maybe while this process runs no Python, or after it is gone), the weights go in a Spark
broadcast. A Keras 3 model's own classes and functions go along, cloudpickled (native_model.py).

Test hook: when ``TFBARRIER_MODEL_LOAD_LOG`` (settings.MODEL_LOAD_LOG_ENV) names a file in an
executor's environment, every model load appends a line ``<pid> <model id>`` to it.
"""

import collections
import contextlib
import dataclasses
import hashlib
import os

import cloudpickle

from tfbarrier import atomic
from tfbarrier.errors import ClusterError
from tfbarrier.models import native_model, presets
from tfbarrier.models.model_spec import archive_digest, keras_flavor, keras_module, save_archive
from tfbarrier.models.weights_file import read_weights, tf_variable, write_weights
from tfbarrier.settings import MODEL_LOAD_LOG_ENV
from tfbarrier.spark import cluster, driver_link, preflight, transfer
from tfbarrier.spark.attachment import is_attached

_CACHE_SIZE = 2  # models kept per Python worker
MODELS_KEPT = 4  # weights files kept per executor host
_models = collections.OrderedDict()  # model id -> loaded model, in this Python worker


def scoring_model(spark, model, adapters=None):
    """What executors rebuild ``model`` from: its flavor, JSON config and weights, the weights served by
    the driver (a transfer.Payload and the server's endpoint) or, where it cannot serve them, in a
    broadcast; and an id naming that model. With ``adapters`` (presets.LoraAdapters, ``model`` their task), only
    the adapters travel: each executor loads the preset itself."""
    flavor = keras_flavor(model)
    if adapters is not None:
        config, name = adapters.preset, f"{hashlib.sha256(adapters.weights).hexdigest()[:32]}-scoring.lora.h5"
        write = adapters.save
    elif flavor == "keras3" and _keeps_assets(model):
        archive, config = save_archive(model), ""  # ModelError in words when it cannot be saved
        name = f"{archive_digest(archive)[:32]}-scoring.keras"  # not the bytes': they hold the second it was saved

        def write(path):
            with open(path, "wb") as f:
                f.write(archive)
    else:
        config = model.to_json()
        # The weights' digest names their file: the session's server writes a content it serves already only once.
        name = f"{write_weights(model.weights)[:32]}-scoring.safetensors"

        def write(path):
            write_weights(model.weights, path)

    source = None
    if cluster.driver_link_enabled(spark) and not is_attached(spark):
        try:  # over TLS where the job's traffic must be encrypted (tls.py)
            files, server = transfer.session_server(cluster.driver_host(spark), encrypted=preflight.encryption_required(spark))
            source = {"endpoint": server.endpoint, "payload": files.add_file(name, write)}
        except OSError:
            source = None
    if source is None:
        with transfer.JobFiles() as scratch:
            payload = scratch.inline(scratch.add(name, write))
        source = {"broadcast": cluster.broadcast(spark, payload.data), "payload": dataclasses.replace(payload, data=None)}
    model_id = hashlib.sha256((config + source["payload"].name).encode()).hexdigest()[:32]
    # Keras 3's own classes and functions the config names (custom layers, a subclassed model's class)
    objects = native_model.pickled_custom_objects(model) if flavor == "keras3" and adapters is None else None
    preset = adapters and {"path": adapters.preset, "task": adapters.task, "rank": adapters.rank,
                           "quantize": adapters.quantize}
    return {"flavor": flavor, "config": config, "id": model_id, "objects": objects, "preset": preset, **source}


def _keeps_assets(model):
    """Whether some state of the Keras 3 ``model`` lives only in a ``.keras`` archive's assets, which neither its
    config nor its weights hold: a text model's preprocessor (its tokenizer's vocabulary), an adapted lookup
    layer (StringLookup, IntegerLookup, TextVectorization)."""
    if getattr(model, "preprocessor", None) is not None:
        return True
    layers = model._flatten_layers() if hasattr(model, "_flatten_layers") else model.layers  # nested ones too
    return any(hasattr(layer, "save_assets") for layer in layers)


def _models_directory():
    """Where this executor keeps its copies of scoring models: in the application's own files directory
    (Spark's, which only the executor's user enters and Spark removes with the application), not at a
    fixed path of the temporary directory that another local user could read or make first."""
    from pyspark import SparkFiles

    directory = os.path.join(SparkFiles.getRootDirectory(), "tfbarrier-models")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return directory


def weights_file(scoring):
    """This host's copy of the scoring model's weights, fetched from the driver the first time; a copy kept
    here is used only while it is still the file the model's digest names."""
    directory = _models_directory()
    payload = scoring["payload"]
    path = os.path.join(directory, payload.name)
    with contextlib.suppress(FileNotFoundError):  # another Python worker of this host may prune it meanwhile
        if transfer.sha256_of(path) == payload.sha256:
            os.utime(path)
            return path
        os.unlink(path)  # changed since it was fetched: fetched again
    if "broadcast" in scoring:
        with atomic.written_aside(path) as f:
            f.write(scoring["broadcast"].value)
    else:
        endpoint = scoring["endpoint"]
        try:
            driver_link.fetch(endpoint, payload.name, path, payload.sha256)
        except OSError as exc:
            raise ClusterError(
                f"this executor could not fetch the model from the driver at {endpoint['host']}:{endpoint['port']} "
                f"({type(exc).__name__}: {exc}): executors must reach the driver on that port, or set "
                "spark.tfbarrier.driverLink=false to send models through Spark") from None
    prune_models(directory, MODELS_KEPT)
    return path


def prune_models(directory, kept):
    """Delete all but the ``kept`` most recently used weights files in ``directory``. The host's other
    Python workers may prune at the same moment: a file they deleted first is not an error."""
    used = {}
    for entry in os.scandir(directory):
        if ".part-" not in entry.name:
            with contextlib.suppress(FileNotFoundError):
                used[entry.path] = entry.stat().st_mtime
    for old in sorted(used, key=used.get, reverse=True)[kept:]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(old)


def load(scoring):
    model_id = scoring["id"]
    if model_id not in _models:
        import tensorflow as tf
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and not _models:  # first TensorFlow use in this Python worker
            try:
                tf.config.threading.set_intra_op_parallelism_threads(context.cpus())
            except RuntimeError:
                pass  # TensorFlow already initialised by earlier code in this worker
        keras = keras_module(scoring["flavor"])
        objects = cloudpickle.loads(scoring["objects"]) if scoring.get("objects") else {}
        if scoring.get("preset"):
            preset = scoring["preset"]
            model = presets.task_with_adapters(preset["path"], preset["task"], preset["rank"], weights_file(scoring),
                                               preset["quantize"])
        elif scoring["payload"].name.endswith(".keras"):
            model = native_model.load_archive(weights_file(scoring), objects)
        else:
            with keras.saving.custom_object_scope(objects) if objects else contextlib.nullcontext():
                model = keras.models.model_from_json(scoring["config"])
            read_weights(weights_file(scoring), model.weights, lambda variable: [tf_variable(variable)])
        _models[model_id] = model
        while len(_models) > _CACHE_SIZE:
            _models.popitem(last=False)
        log = os.environ.get(MODEL_LOAD_LOG_ENV)
        if log:
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {model_id}\n")
    _models.move_to_end(model_id)
    return _models[model_id]
