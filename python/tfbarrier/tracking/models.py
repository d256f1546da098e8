"""The trained model in its run: an MLflow model in the flavor of its own Keras, with its signature and
pip requirements, or its ``.keras`` archive where MLflow has no flavor for it, or a preset fit's LoRA adapters
as their file, with the preset they go on in the run's tags.
"""

import importlib.metadata
import os
import tempfile

MODEL_NAME = "model"  # the trained model's name in its run


def log_model(client, run_id, model):
    """Log ``model`` as the run's MLflow model in its own Keras's flavor: ``mlflow.keras`` for Keras 3
    (``mlflow.keras.load_model`` returns a Keras 3 model), ``mlflow.tensorflow`` for tf_keras where
    ``tf.keras`` is tf_keras (``TF_USE_LEGACY_KERAS=1``; ``mlflow.tensorflow.load_model``). MLflow has no
    flavor for a tf_keras model beside Keras 3: there the run gets its ``.keras`` archive,
    ``model/model.keras``, which ``tf_keras.models.load_model`` reads."""
    import mlflow
    from mlflow.models import Model

    from tfbarrier.models.model_spec import keras_flavor
    from tfbarrier.models.presets import LoraAdapters

    if isinstance(model, LoraAdapters):
        _log_adapters(client, run_id, model)
        return
    flavor = keras_flavor(model)
    if flavor == "tf_keras" and not _tf_keras_is_tf_keras(model):
        with tempfile.TemporaryDirectory(prefix="tfbarrier-") as tmp:
            path = os.path.join(tmp, f"{MODEL_NAME}.keras")
            model.save(path)
            client.log_artifact(run_id, path, MODEL_NAME)
        client.set_tag(run_id, "tfbarrier.model", f"{MODEL_NAME}/{MODEL_NAME}.keras: tf_keras.models.load_model")
        return
    module, requirements = ((mlflow.keras, ("keras",)) if flavor == "keras3"
                            else (mlflow.tensorflow, ("tf-keras",)))
    requirements = [f"{name}=={version}" for name in (*requirements, "tensorflow", "tensorflow-cpu")
                    if (version := installed_version(name))]  # given, MLflow does not load the model to infer them
    # Created here so that it belongs to the run's experiment: MLflow would take the current one. Model.log
    # writes to the current tracking URI, which ``client`` was made for when the fit started.
    logged = client.create_logged_model(client.get_run(run_id).info.experiment_id, name=MODEL_NAME,
                                        source_run_id=run_id)
    Model.log(artifact_path=None, flavor=module, name=MODEL_NAME, run_id=run_id, model_id=logged.model_id,
              model=model, signature=_signature(model), pip_requirements=requirements)


def _log_adapters(client, run_id, adapters):
    """A preset's LoRA fit: the adapters' file (``model/adapters.lora.h5``, what ``load_lora_weights`` reads) and
    tags naming the preset, its task and the rank they go on. MLflow has no flavor for adapters alone, and
    logging the task with them would load the whole preset here."""
    from tfbarrier.models.presets import ADAPTERS_FILE

    with tempfile.TemporaryDirectory(prefix="tfbarrier-") as tmp:
        client.log_artifact(run_id, adapters.save(os.path.join(tmp, ADAPTERS_FILE)), MODEL_NAME)
    for name, value in (("tfbarrier.model", f"{MODEL_NAME}/{ADAPTERS_FILE}: task.backbone.load_lora_weights"),
                        ("tfbarrier.preset", adapters.preset), ("tfbarrier.preset_task", adapters.task),
                        ("tfbarrier.lora_rank", adapters.rank)):
        client.set_tag(run_id, name, str(value))


def installed_version(*distributions):
    """The version of the first of ``distributions`` that is installed, or None."""
    for distribution in distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _tf_keras_is_tf_keras(model):
    """Whether tf.keras is tf_keras in this process (TF_USE_LEGACY_KERAS=1), as mlflow.tensorflow asks."""
    from tensorflow.keras.models import Model as TfKerasModel

    return isinstance(model, TfKerasModel)


def _signature(model):
    """float32 tensors of the model's input and output shapes, any batch size."""
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    def schema(shape):
        if not isinstance(shape, tuple):  # several outputs: not described
            return None
        return Schema([TensorSpec(np.dtype("float32"), tuple(-1 if d is None else d for d in shape))])

    return ModelSignature(inputs=schema(tuple(model.input_shape)), outputs=schema(tuple(model.output_shape)))
