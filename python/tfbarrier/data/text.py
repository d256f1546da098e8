"""Text in: a string column (``TextColumn``, its layout) becomes the model's inputs through the model's own
preprocessor (a KerasHub task's tokenizer and sequence packer, at the preprocessor's ``sequence_length``), batch
by batch as a training process streams its shard, so no token arrays are made in Spark.

A model that trains on text trains with its preprocessor taken off (``take_off``), as KerasHub's ``Task``
allows: its ``fit`` would otherwise map the preprocessor over the dataset a second time, and tfbarrier's
validation calls the model on batches the preprocessor already made. It is put back before the model is saved,
so the trained model that comes back scores strings as the user's did. Scoring needs nothing of this: a task's
``predict_on_batch`` runs its preprocessor itself.
"""

import contextlib
import dataclasses

import numpy as np
import pyarrow as pa

from tfbarrier.data.features import Features, value_column
from tfbarrier.errors import ModelError


class TextColumn(Features):
    """One string column, which the model's own preprocessor turns into its inputs in the training process (a
    KerasHub task's tokenizer and packer, at the preprocessor's sequence length): no token arrays in Spark."""

    takes_text = True

    def check_input(self, input_shape, width=None):
        """Nothing: the preprocessor makes the model's inputs, whatever their shapes."""

    def empty_x_type(self):
        return pa.string()

    def y(self, batch):
        """The label column; without one (the preprocessor makes the labels), a zero a row that it ignores."""
        return super().y(batch) if self.labels else pa.array(np.zeros(len(batch), np.float32))

    def x(self, batch):
        """The text column as a string array (one text per row)."""
        return value_column(batch, self.features[0], "text column")


def check_model(model, column, keras3):
    """Refuse, on the driver, a model that cannot read the text column ``column``: it must be a Keras 3 model
    (``keras3``; a KerasHub task) that carries a preprocessor."""
    if keras3 and getattr(model, "preprocessor", None) is not None:
        return
    why = ("it has no preprocessor" if keras3
           else "only a Keras 3 model object (a KerasHub task) carries its preprocessor to the workers")
    raise ModelError(f"feature column {column!r} holds strings, but the model cannot read them: {why}. Give a "
                     "model whose preprocessor tokenizes text (a KerasHub task such as "
                     "keras_hub.models.BertTextClassifier with its preprocessor), or tokenize the column into "
                     "arrays of token ids first")


def sequence_widths(model):
    """{None: tokens a row} of the inputs ``model``'s preprocessor makes (every one of them as long as its
    ``sequence_length``), for the memory check's trace of a step; {} where the preprocessor does not say."""
    length = getattr(getattr(model, "preprocessor", None), "sequence_length", None)
    return {None: int(length)} if isinstance(length, int) and length > 0 else {}


def take_off(model):
    """The model's preprocessor, taken off the model (see the module's docstring); ``put_back`` returns it."""
    preprocessor = model.preprocessor
    model.preprocessor = None
    return preprocessor


def put_back(model, preprocessor):
    """``model`` with its ``preprocessor`` again."""
    model.preprocessor = preprocessor
    return model


@contextlib.contextmanager
def attached(model, preprocessor):
    """``model`` with ``preprocessor`` put back while inside, taken off again after (None: ``model`` as it is):
    what a text fit saves while it trains must score strings as the trained model does."""
    if preprocessor is None:
        yield model
        return
    put_back(model, preprocessor)
    try:
        yield model
    finally:
        take_off(model)


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """What makes a training process's batches of strings the model's: its ``preprocessor``, called with the
    labels when the rows have a label column (``labelled``), else on the strings alone (a causal LM's makes
    the labels and their weights)."""

    preprocessor: object
    labelled: bool


def _takes_labels(preprocessor):
    """Whether the preprocessor is called with the labels and weights: KerasHub's own rule (``Task.preprocess_samples``),
    a ``Preprocessor`` is, any other layer or callable is not."""
    try:
        from keras_hub.models import Preprocessor
    except ImportError:
        return False
    return isinstance(preprocessor, Preprocessor)


def preprocessed(ds, preprocessing, validation=False):
    """``ds``, batches of (strings, labels[, weights]), as ``preprocessing`` makes them: (inputs, labels[,
    weights]); with ``validation``, batches of (strings, labels, present, weights) whose ``present`` stays."""
    import keras
    import tensorflow as tf

    preprocessor = preprocessing.preprocessor
    labels_too = _takes_labels(preprocessor)

    def made(x, y, weights):
        if not preprocessing.labelled:
            return keras.utils.unpack_x_y_sample_weight(preprocessor(x))
        out = preprocessor(x, y=y, sample_weight=weights) if labels_too else (preprocessor(x), y, weights)
        return keras.utils.unpack_x_y_sample_weight(out)

    if validation:
        def element(x, y, present, weights):
            x, y, made_weights = made(x, y, weights)
            return x, y, present, weights if made_weights is None else made_weights
    else:
        def element(x, y, *weights):
            return keras.utils.pack_x_y_sample_weight(*made(x, y, weights[0] if weights else None))
    return ds.map(element, num_parallel_calls=tf.data.AUTOTUNE)
