"""What a fit over tfbarrier's ring hooks into Keras (ring_side.py): the optimizer's apply wrapped so that
each step's gradients cross the ring (``exchange_gradients``), the epoch's metric states summed
(``sum_metrics``), and the callbacks that keep the workers one model (``GlobalBatchLogs``, ``ExchangedOnly``,
``AverageState``, ``StopTogether``). Imported only in training processes."""

import numpy as np
import tensorflow as tf
import tf_keras

from tfbarrier.errors import ModelError
from tfbarrier.exchange.base import PACK_BYTES

EVERY_VARIABLE = "every variable"  # in ``exchanged``: an optimizer's update of all it holds went through the ring


def exchange_gradients(optimizer, ring, flavor, options=None, exchanged=None, last_layers_first=True):
    """Make ``optimizer`` (of the ``flavor``'s Keras: fitting.flavors.Keras3 or TfKeras) apply the mean of every worker's
    gradients. They cross ``ring`` from inside the compiled step in packs: consecutive gradients together up
    to ``bytes_per_pack`` (fit's ``communication``; 0: one pack), a larger one alone (no copy of it is made
    to join a pack), last layers first (the backward pass makes theirs first: a pack travels while it goes
    on), one pack after the other (the ring carries one exchange at a time, in the same order on every
    worker); in float16 with ``compression="fp16"``, as strategy.py does under the strategy.
    The variables whose gradients crossed are added to ``exchanged`` (their ids) as the step is traced.
    ``last_layers_first=False``: the order before it was (bench/pack_order.py measures what it gains).
    Returns what FitResult.workers reports of it."""
    pack_bytes, dtype, share, described = packing(options, ring)

    def summed(flat):
        # in place: ``flat`` is this pack's own buffer, and TensorFlow takes the result back without a copy
        return ring.all_reduce_sum(flat, in_place=True)

    def mean_of(grads, variables):
        if exchanged is not None:
            exchanged.update([id(v) for v in variables] if variables is not None else [EVERY_VARIABLE])
        if ring.size > 1:
            after = []  # the ring's exchanges, one after the other, in the same order on every worker
            sparse = [i for i, grad in enumerate(grads) if isinstance(grad, tf.IndexedSlices)]
            # last layers first: the backward pass makes their gradients first, so the first packs can travel
            # while it goes on (each pack waits only for its own gradients and the pack before it)
            dense = [(i, shaped(grad, variables, i)) for i, grad in enumerate(grads)
                     if grad is not None and i not in sparse][::-1 if last_layers_first else 1]
            for pack in packs(dense, pack_bytes):
                with tf.control_dependencies(after):
                    flat = tf.concat([tf.reshape(tf.cast(grad, dtype) * tf.cast(share, dtype), [-1])
                                      for _, grad in pack], 0)
                    mean = tf.numpy_function(summed, [flat], dtype, stateful=True)
                after = [mean]
                pieces = tf.split(mean, [grad.shape.num_elements() for _, grad in pack]) if len(pack) > 1 else [mean]
                for (i, grad), piece in zip(pack, pieces):
                    grads[i] = tf.cast(tf.reshape(piece, grad.shape), grad.dtype)
            for i in sparse[::-1]:  # an embedding's, usually the first layer's: the backward pass ends with it
                grads[i], after = _gathered_slices(grads[i], ring, after)
        return grads

    flavor.wrap_step(optimizer, lambda apply, grads, variables: apply(mean_of(grads, variables), variables))
    return described


def packing(options, ring):
    """How a step's packs travel, from fit's ``communication`` ``options``: (the most bytes a pack holds, the dtype
    they travel in, each worker's share of the mean as a variable, what FitResult.workers reports of it)."""
    options = options or {}
    # each worker's share of the mean, a variable: a gradient no data or weight moves (an added loss's, linear in its
    # weight) is folded into a constant by TensorFlow's graph optimizer, whose buffer every step reuses; multiplied
    # by a value read at run time, the pack is a buffer of the step's own (a gradient's, reused by the product only
    # when nothing else reads it), which the sum may overwrite
    share = tf.Variable(1.0 / ring.size, trainable=False, name="tfbarrier_share")
    return (options.get("bytes_per_pack", PACK_BYTES) or float("inf"),
            tf.float16 if options.get("compression") == "fp16" else tf.float32, share,
            {"bytes_per_pack": options.get("bytes_per_pack", PACK_BYTES), "compression": options.get("compression", "none"),
             "encryption": ring.encryption or "none"})


def _gathered_slices(grad, ring, after):
    """A sparse gradient (an embedding's IndexedSlices: a row per lookup, the same count on every worker)
    as every worker's rows together, their values divided by the workers: what one process's gradient on
    the global batch holds, for Keras's sparse update (densified, Adam's would differ). Returns it and the
    exchange the next must follow."""
    def gather(values):
        return ring.all_gather(values).reshape(-1, *values.shape[1:])

    with tf.control_dependencies(after):
        values = tf.numpy_function(gather, [grad.values], grad.values.dtype, stateful=True)
    with tf.control_dependencies([values]):
        indices = tf.numpy_function(gather, [grad.indices], grad.indices.dtype, stateful=True)
    values = tf.reshape(values, [-1, *grad.values.shape[1:]]) / tf.cast(ring.size, grad.values.dtype)
    return tf.IndexedSlices(values, tf.reshape(indices, [-1]), grad.dense_shape), [indices]


def shaped(grad, variables, index):
    """``grad`` with its variable's static shape when its own is not known as traced (a slice's gradient
    where the batches' sequence length is dynamic, as a preprocessor makes them): packs need sizes."""
    if grad.shape.is_fully_defined() or variables is None:
        return grad
    return tf.reshape(grad, variables[index].shape)


def packs(gradients, pack_bytes):
    """``gradients`` ((index, tensor) in order) in runs of at most ``pack_bytes`` of float32 (a larger one alone)."""
    packs, size = [], 0
    for index, grad in gradients:
        grad_bytes = 4 * grad.shape.num_elements()
        if not packs or size + grad_bytes > pack_bytes:
            packs.append([])
            size = 0
        packs[-1].append((index, grad))
        size += grad_bytes
    return packs


def sum_metrics(model, ring, reader):
    """Make the epoch's results (read by the model's method ``reader``) read every worker's metric states,
    summed (or averaged, for a variable that aggregates by mean), as one process holding every batch would
    have them."""
    results = getattr(model, reader)

    def global_results(logs):
        ring.sum_variables([v for metric in model.metrics for v in metric.variables])
        return results(logs)

    setattr(model, reader, global_results)


class GlobalBatchLogs(tf_keras.callbacks.Callback):
    """First of the callbacks: a call's logs (this worker's running loss and metrics) replaced by their mean
    across ``ring``. Every worker ran as many steps of as many rows, so the mean is the global batches'
    running value, what the strategy's logs hold: the progress bar and the user's batch-level callbacks see it."""

    def __init__(self, ring):
        super().__init__()
        self.ring = ring

    def on_train_batch_end(self, batch, logs=None):
        if not logs or self.ring.size == 1:
            return
        keys = sorted(key for key, value in logs.items() if np.ndim(value) == 0)
        means = self.ring.all_reduce_sum(np.array([float(logs[key]) for key in keys])) / self.ring.size
        logs.update(zip(keys, means.tolist()))


class ExchangedOnly(tf_keras.callbacks.Callback):
    """After the first call, refuses a training step that updated trainable weights without ``model.optimizer``
    (a custom ``train_step`` with a second optimizer): their gradients never crossed the ring (they are not
    in ``exchanged``), so the replicas drift apart. Such a weight found different across the workers fails
    the fit in words; the weights that crossed cost nothing to check."""

    def __init__(self, ring, exchanged):
        super().__init__()
        self.ring, self.exchanged, self.checked = ring, exchanged, False

    def on_train_batch_end(self, batch, logs=None):
        if self.checked or EVERY_VARIABLE in self.exchanged:
            return
        self.checked = True
        unexchanged = [v for v in self.model.trainable_variables if id(v) not in self.exchanged]
        if not unexchanged or self.ring.size == 1:
            return
        drifted = [getattr(v, "path", v.name) for v in self.ring.differing(unexchanged)]
        if drifted:
            raise ModelError(
                f"the training step updated {', '.join(drifted)} without model.optimizer (a custom train_step "
                "with an optimizer of its own?): their gradients never crossed between the workers, whose copies "
                "of them now differ. Update every trainable weight through model.optimizer (one optimizer; "
                "keras.optimizers has none that takes two learning rates, but a LossScaleOptimizer or a schedule "
                "wraps one), or make those weights non-trainable")


def average_moving_statistics(ring, model):
    """Every worker's non-trainable float weights that differ between workers (BatchNormalization's moving
    mean and variance, which each worker updates from its own rows) replaced by their mean across ``ring``,
    as the strategy reads them. Frozen weights (a fine-tune's backbone) are the same on every worker: only
    their checksums cross the ring, and no float64 copy of them is made."""
    floats = [v for v in model.non_trainable_variables if "float" in str(v.dtype)]
    ring.sum_variables(ring.differing(floats), mean=True)


class AverageState(tf_keras.callbacks.Callback):
    """At each epoch's end, the moving statistics averaged across ``ring`` (average_moving_statistics): the
    model validated, saved and returned is one model."""

    def __init__(self, ring):
        super().__init__()
        self.ring = ring

    def on_epoch_end(self, epoch, logs=None):
        average_moving_statistics(self.ring, self.model)


# The hooks after which Keras's fit looks at stop_training within an epoch (a stop set in any of them ends it
# after that call's batch end)
MID_EPOCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end", "on_epoch_begin")
# Keras's (and tf_keras's) callbacks with hooks there that never stop the training
KERAS_NEVER_STOP = frozenset({"TensorBoard", "ModelCheckpoint", "BackupAndRestore", "CSVLogger", "ProgbarLogger",
                              "History", "RemoteMonitor"})


class StopTogether(tf_keras.callbacks.Callback):
    """Last of the callbacks: when any worker's callbacks stopped the training (TerminateOnNaN on its own
    batch's loss, a time budget), every worker stops after the same call, so the ring stays in step. They agree
    after every call only when one of ``callbacks`` can stop the training there (``stops_after_a_call``); else at
    each epoch's end alone, and a call costs one exchange fewer (the same on every worker: they run the same
    callbacks)."""

    def __init__(self, ring, callbacks):
        super().__init__()
        self.ring = ring
        self.could_stop = any(map(stops_after_a_call, callbacks))
        self.every_call = True

    def on_train_begin(self, logs=None):
        # agreed, as some callbacks are the chief's alone (TensorBoard) and a user's may differ by worker
        self.every_call = bool(self.ring.all_reduce_sum(np.array([float(self.could_stop)]))[0])

    def _agree(self):
        if self.ring.all_reduce_sum(np.array([float(bool(self.model.stop_training))]))[0]:
            self.model.stop_training = True

    def on_train_batch_end(self, batch, logs=None):
        if self.every_call:
            self._agree()

    def on_epoch_end(self, epoch, logs=None):
        self._agree()


def stops_after_a_call(callback):
    """Whether ``callback`` can stop the training in an epoch: it has a hook of its own that runs there
    (MID_EPOCH_HOOKS: TerminateOnNaN's, a user's, a LambdaCallback's given one) and is neither tfbarrier's nor one
    of Keras's that never stop (KERAS_NEVER_STOP)."""
    kind = type(callback)
    if kind.__module__.startswith("tfbarrier.") or (kind.__module__.startswith(("keras.", "tf_keras."))
                                                     and kind.__name__ in KERAS_NEVER_STOP):
        return False
    import keras

    bases = (keras.callbacks.Callback, tf_keras.callbacks.Callback)  # whose hooks do nothing
    for hook in MID_EPOCH_HOOKS:
        if callable(vars(callback).get(hook)):  # LambdaCallback keeps the functions it was given on itself
            return True
        if next(cls for cls in kind.__mro__ if hook in vars(cls)) not in bases:
            return True
    return False
