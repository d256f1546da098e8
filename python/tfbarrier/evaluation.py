"""Validation across workers (fit's validation_data and validation_split): every validation row is
evaluated exactly once per validation, however uneven the workers' validation shards.

Each worker runs the same number of steps over its own shard, padded with rows marked absent
(shards.validation_dataset_fn). The loss is summed over the present rows, then across workers; the
model's compiled metrics are updated with the present rows alone, and Keras reduces them across
workers when they are read. So ``val_loss`` is the mean loss over the validation rows (plus
the regularization losses, as Keras reports it) and ``val_accuracy`` counts each row once: what a
single process's ``model.evaluate`` of the same rows gives.

The values go into the epoch's logs before any other callback sees them, the same on every worker,
so EarlyStopping or ReduceLROnPlateau decide alike everywhere and every worker stops at the same epoch.
"""

import tensorflow as tf
import tf_keras
from tf_keras.src.losses import LossFunctionWrapper

from .errors import ModelError


def per_example_loss(model):
    """The model's compiled loss, unreduced: one value per example."""
    loss = model.loss
    if isinstance(loss, (dict, list, tuple)):
        raise ModelError("validation needs a model compiled with one loss, not one per output")
    loss = tf_keras.losses.get(loss)
    if isinstance(loss, tf_keras.losses.Loss):
        return type(loss).from_config({**loss.get_config(), "reduction": tf_keras.losses.Reduction.NONE})
    # A loss given by name or as a function ("mse"): wrapped as compile() wraps it, which also matches
    # the label's and the prediction's shapes. tf_keras exports no such wrapper.
    return LossFunctionWrapper(loss, reduction=tf_keras.losses.Reduction.NONE)


class Validation(tf_keras.callbacks.Callback):
    """Adds ``val_loss`` and ``val_<metric>`` to the logs of every ``every``-th epoch, from ``steps``
    steps over ``dataset`` (distributed, of (x, y, present, sample weight) batches: present is 0 for the
    padding rows). As in model.evaluate, the loss is the mean over the rows of each row's loss times its
    sample weight."""

    def __init__(self, dataset, steps, every=1):
        super().__init__()
        self.dataset, self.steps, self.every = dataset, steps, every

    def on_train_begin(self, logs=None):
        model, strategy, loss = self.model, self.model.distribute_strategy, per_example_loss(self.model)

        @tf.function
        def step(iterator):
            def on_replica(x, y, present, weight):
                predicted = model(x, training=False)
                # Keras's compiled metrics= ignore sample weights: the padding rows are left out instead;
                # weighted_metrics= take the rows' own weights, as in model.evaluate.
                real = present > 0
                model.compiled_metrics.update_state(tf.boolean_mask(y, real), tf.boolean_mask(predicted, real),
                                                    tf.boolean_mask(weight, real))
                losses = tf.cast(loss(y, predicted), tf.float32) * weight * present
                return tf.reduce_sum(losses), tf.reduce_sum(present)

            total, count = strategy.run(on_replica, args=next(iterator))
            return (strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None),
                    strategy.reduce(tf.distribute.ReduceOp.SUM, count, axis=None))

        self._step = step

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or (epoch + 1) % self.every:
            return
        metrics = self.model.compiled_metrics.metrics
        for metric in metrics:
            metric.reset_state()
        iterator = iter(self.dataset)
        total = count = 0.0
        for _ in range(self.steps):
            step_total, step_count = self._step(iterator)
            total, count = total + float(step_total), count + float(step_count)
        regularization = float(tf.add_n(self.model.losses)) if self.model.losses else 0.0
        logs["val_loss"] = total / count + regularization
        for metric in metrics:  # read across workers: every worker reads them in this order
            logs[f"val_{metric.name}"] = float(metric.result())
