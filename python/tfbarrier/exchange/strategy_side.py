"""The "strategy" exchange in a training process (``StrategySide``): MultiWorkerMirroredStrategy, the model built
in its scope, the shard's dataset distributed by it. The strategy sums the gradients, metrics and validation
inside Keras's own calls, so the loop's callbacks need no collective of their own. Imported only in training
processes. fit's ``communication`` as the strategy takes it:

- ``bytes_per_pack``, ``timeout_seconds`` and ``implementation`` ("auto", "ring" or "nccl") are
  tf.distribute's CommunicationOptions, given to MultiWorkerMirroredStrategy as they are; ``bytes_per_pack`` is
  PACK_BYTES unless given. TensorFlow packs the gradients into all-reduces of about that size, but never
  splits one: a gradient larger than a pack is cut into pieces of one pack each (``all_reduce_in_pieces``),
  because gRPC's receiving side holds about three copies of each message at once, and a large model's
  whole gradient in one all-reduce (TensorFlow's own default, ``bytes_per_pack=0``) cost a training
  process gigabytes. ``bytes_per_pack=0`` asks for that one all-reduce.
- ``compression="fp16"`` all-reduces the gradients in float16: each worker casts its float32
  gradients down before the all-reduce and the sums back up after it, as Horovod's
  ``Compression.fp16`` and PyTorch DDP's ``fp16_compress_hook`` do. Half the bytes cross the network
  (the large model's 3.7 MB per step become 1.9 MB), for about three significant digits per gradient
  and float16's range (beyond 65,504 a gradient becomes inf). The hook is the optimizer's own
  (tf_keras's ``aggregate_gradients``, a legacy optimizer's ``gradient_aggregator``), so a training
  step that aggregates its gradients itself is not compressed.
- MultiWorkerMirroredStrategy gives every variable worker 0's initial value, a broadcast that
  keras_helpers.initial_values_local skips where every worker makes the same values itself.
"""

from tfbarrier.errors import ModelError
from tfbarrier.exchange.base import PACK_BYTES, WorkerSide
from tfbarrier.faults import port_clash_is_retryable
from tfbarrier.keras_helpers import inner_optimizer


class StrategySide(WorkerSide):
    def __init__(self, exchange, job, config):
        import tensorflow as tf

        with port_clash_is_retryable():
            self.distribution = tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=strategy_options(tf, job.communication))
        self.exchange, self.size = exchange, len(config["tf_config"]["cluster"]["worker"])

    def scope(self):
        return self.distribution.scope()

    def hook(self, model, flavor, job):
        all_reduce_in_pieces(model, job.communication)
        compress_gradients(model, job.communication)
        if model.distribute_reduction_method == "auto":
            # A step's metric results are already reduced across workers (tf_keras reads them in a
            # merge_call); "auto" would add up every replica's identical copy, at two all-reduces per step.
            model.distribute_reduction_method = "first"

    def dataset(self, make):
        return self.distribution.distribute_datasets_from_function(make)

    def communication(self, model):
        return self.exchange.describe(in_effect(self.distribution, model))


def strategy_options(tf, communication):
    """tf.distribute's CommunicationOptions from fit's ``communication`` dict (None: TensorFlow's defaults)."""
    communication = dict(communication or {})
    communication.pop("compression", None)
    communication.setdefault("bytes_per_pack", PACK_BYTES)
    implementation = communication.pop("implementation", "auto").upper()
    return tf.distribute.experimental.CommunicationOptions(
        implementation=getattr(tf.distribute.experimental.CommunicationImplementation, implementation),
        **communication)


def _aggregation_hook(optimizer):
    """The name of the attribute through which ``optimizer`` (past a LossScaleOptimizer) all-reduces its
    gradients: a legacy tf_keras optimizer's ``gradient_aggregator``, a tf_keras optimizer's
    ``aggregate_gradients``; None for one that has neither (Keras 3's)."""
    optimizer = inner_optimizer(optimizer)
    return next((hook for hook in ("gradient_aggregator", "aggregate_gradients") if hasattr(optimizer, hook)), None)


def _wrap_aggregation(optimizer, wrapper):
    """Put ``wrapper(aggregate)`` in place of ``optimizer``'s aggregation hook; False when it has none."""
    hook, optimizer = _aggregation_hook(optimizer), inner_optimizer(optimizer)
    if hook is None:
        return False
    setattr(optimizer, hook, wrapper(getattr(optimizer, hook)))
    return True


def all_reduce_in_pieces(model, communication):
    """Make ``model``'s optimizer all-reduce each gradient larger than a pack (``bytes_per_pack``) in
    pieces of one pack, then put it back together; bytes_per_pack=0 leaves it whole. Before fit traces
    the training step, which is when Keras reads the hook."""
    piece_bytes = (communication or {}).get("bytes_per_pack", PACK_BYTES)
    if piece_bytes:
        _wrap_aggregation(model.optimizer, lambda aggregate: in_pieces(aggregate, piece_bytes))


def compress_gradients(model, communication):
    """Make ``model``'s optimizer all-reduce its gradients in float16 when fit asked for it. Before
    fit traces the training step, which is when Keras reads the hook."""
    if (communication or {}).get("compression", "none") == "none":
        return
    if not _wrap_aggregation(model.optimizer, in_float16):
        raise ModelError(f"communication={{'compression': 'fp16'}} needs a tf_keras optimizer, whose gradient "
                         f"aggregation it compresses; {type(inner_optimizer(model.optimizer)).__name__} has none: "
                         "drop compression")


def in_effect(strategy, model):
    """What the gradients travel with, read back from TensorFlow (not fit's argument): the strategy's
    CommunicationOptions, and "fp16" when the optimizer's aggregation casts them to float16."""
    options = strategy.extended._communication_options  # tf.distribute has no public reader of them
    hook = _aggregation_hook(model.optimizer)
    hook = hook and getattr(inner_optimizer(model.optimizer), hook)
    return {"implementation": options.implementation.name.lower(), "bytes_per_pack": options.bytes_per_pack,
            "timeout_seconds": options.timeout_seconds,
            "compression": getattr(hook, "compression", "none")}


def in_float16(aggregate):
    """``aggregate`` (a list of (gradient, variable) in, all-reduced out) with its float32 gradients
    sent as float16."""
    import tensorflow as tf

    def aggregate_in_float16(grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        wide = [g is not None and g.dtype == tf.float32 for g, _ in grads_and_vars]
        narrowed = [(tf.cast(g, tf.float16) if w else g, v) for (g, v), w in zip(grads_and_vars, wide)]
        return [(tf.cast(g, tf.float32) if w else g, v) for (g, v), w in zip(aggregate(narrowed), wide)]

    aggregate_in_float16.compression = "fp16"  # what in_effect reports
    return aggregate_in_float16


def in_pieces(aggregate, piece_bytes):
    """``aggregate`` (a list of (gradient, variable) in, all-reduced out) with each dense gradient of more
    than ``piece_bytes`` sent as pieces of its flattened values (slices, not copies), joined again after."""
    import tensorflow as tf

    def aggregate_in_pieces(grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        pieces, counts = [], []
        for gradient, variable in grads_and_vars:
            split = _pieces(tf, gradient, piece_bytes)
            counts.append(len(split) if split else None)
            pieces.extend((piece, variable) for piece in split or [gradient])
        reduced, joined = iter(aggregate(pieces)), []
        for (gradient, variable), count in zip(grads_and_vars, counts):
            if count is None:
                joined.append(next(reduced))
            else:
                parts = [next(reduced)[0] for _ in range(count)]
                joined.append((tf.reshape(tf.concat(parts, 0), gradient.shape), variable))
        return joined

    aggregate_in_pieces.compression = getattr(aggregate, "compression", "none")
    return aggregate_in_pieces


def _pieces(tf, gradient, piece_bytes):
    """The pieces of ``gradient`` to all-reduce, or None to send it whole (small, sparse or of unknown size)."""
    if not isinstance(gradient, tf.Tensor) or not gradient.shape.is_fully_defined():
        return None
    size = gradient.shape.num_elements()
    if size * gradient.dtype.size <= piece_bytes:
        return None
    step = max(16, piece_bytes // gradient.dtype.size // 16 * 16)  # 64-byte aligned: tf.split slices, not copies
    sizes = [step] * (size // step) + ([size % step] if size % step else [])
    return tf.split(tf.reshape(gradient, [-1]), sizes)
