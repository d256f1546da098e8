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

Under MultiWorkerMirroredStrategy the strategy sums across workers; in a fit over tfbarrier's ring
(exchange/ring_side.py) the ring does: ``Validation`` with a ``ring`` for a tf_keras model, ``Keras3Validation``
for a Keras 3 model.
"""

import functools

import numpy as np
import tensorflow as tf
import tf_keras
from tf_keras.src.engine.compile_utils import match_dtype_and_rank
from tf_keras.src.losses import LossFunctionWrapper

from tfbarrier.errors import ModelError


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


def per_row(values, like):
    """``values`` (one per row) with axes added to multiply ``like`` (a value per position of a sequence, say)."""
    return values[(...,) + (None,) * (like.shape.rank - values.shape.rank)]


class Validation(tf_keras.callbacks.Callback):
    """Adds ``val_loss`` and ``val_<metric>`` to the logs of every ``every``-th epoch, from ``steps``
    steps over ``dataset`` (distributed, of (x, y, present, sample weight) batches: present is 0 for the
    padding rows). As in model.evaluate, the loss is the mean over the rows of each row's loss times its
    sample weight."""

    def __init__(self, dataset, steps, every=1, ring=None):
        super().__init__()
        self.dataset, self.steps, self.every, self.ring = dataset, steps, every, ring

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
                # a label per row against one prediction column, (batch,) against (batch, 1), as compile()
                # matches them: else "mse" or binary cross-entropy would average over the batch, not the column
                labels, _, _ = match_dtype_and_rank(y, predicted, None)
                losses = tf.cast(loss(labels, predicted), tf.float32)
                losses *= per_row(weight, losses) * per_row(present, losses)
                # a sequence label's loss has a value per position: the mean is over positions, as Keras's
                positions = tf.cast(tf.size(losses) // tf.maximum(tf.size(present), 1), tf.float32)
                return tf.reduce_sum(losses), tf.reduce_sum(present) * positions

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
        if self.ring is not None:  # no strategy: the ring sums what it would have
            total, count = self.ring.all_reduce_sum(np.array([total, count]))
            self.ring.sum_variables([variable for metric in metrics for variable in metric.variables])
        regularization = float(tf.add_n(self.model.losses)) if self.model.losses else 0.0
        logs["val_loss"] = total / count + regularization
        for metric in metrics:  # read across workers: every worker reads them in this order
            logs[f"val_{metric.name}"] = float(metric.result())


class Keras3Validation(tf_keras.callbacks.Callback):
    """The same for a Keras 3 model, summed across ``ring`` (Keras 3's ``fit`` takes tf_keras's callbacks):
    ``val_loss`` and ``val_<metric>`` in every ``every``-th epoch's logs, from ``steps`` steps over
    ``dataset`` ((x, y, present, sample weight) batches)."""

    def __init__(self, dataset, steps, ring, every=1):
        super().__init__()
        self.dataset, self.steps, self.ring, self.every = dataset, steps, ring, every

    def on_train_begin(self, logs=None):
        model = self.model

        @tf.function
        def step(x, y, present, weight):
            predicted = model(x, training=False)
            real = present > 0  # the compiled metrics= ignore sample weights: the padding rows are left out
            if model._compile_metrics is not None:
                kept = functools.partial(tf.nest.map_structure, lambda t: tf.boolean_mask(t, real))
                model._compile_metrics.update_state(kept(y), kept(predicted), kept(weight))
            # Keras's compiled loss (each output's, times its loss weight) is a sum over the batch's rows, their
            # weights applied, divided by the rows: times the rows, the sum, which padding rows (weight 0) leave
            rows = tf.cast(tf.shape(present)[0], tf.float32)
            weight = weight * per_row(present, weight)
            total = tf.cast(model._compile_loss(y, predicted, sample_weight=weight), tf.float32) * rows
            return total, tf.reduce_sum(present)

        self._step = step

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or (epoch + 1) % self.every:
            return
        metrics = self.model._compile_metrics
        # each output's loss (a model of several): Keras's Means of the batches' losses, padding rows counted
        per_output = self.model._compile_loss.metrics if self.model._compile_loss is not None else []
        for metric in [metrics, *per_output]:
            if metric is not None:
                metric.reset_state()
        total = np.zeros(2)
        for batch in self.dataset.take(self.steps):
            total += [float(value) for value in self._step(*batch)]
        total = self.ring.all_reduce_sum(np.array([*total, *(float(each.total) for each in per_output)]))
        regularization = float(sum(float(loss) for loss in self.model.losses))
        logs["val_loss"] = total[0] / total[1] + regularization
        # their sums (the rows' losses times the rows of each batch) over the rows that are not padding
        logs.update({f"val_{each.name}": value / total[1] for each, value in zip(per_output, total[2:])})
        if metrics is not None:  # read across workers: every worker sums them in this order
            self.ring.sum_variables(metrics.variables)
            logs.update({f"val_{name}": float(value) for name, value in metrics.result().items()})
