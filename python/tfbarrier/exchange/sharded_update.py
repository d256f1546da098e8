"""The optimizer's state sharded over tfbarrier's ring (fit's ``communication={"shard": "optimizer"}``): ZeRO's
stage 1, at a variable's grain, as PyTorch's ZeroRedundancyOptimizer shards.

Each trainable variable has one owner among the workers (``owners``: the largest first, each to the worker that
owns the fewest bytes so far), and a worker's optimizer (the model's own) is built over the variables it owns
alone, so it holds their slots only: Adam's two slots per weight become 2/N. A step's gradients cross the ring
in packs, last layers first, as ring_hooks.exchange_gradients sends them, but each pack is reduce-scattered
instead of all-reduced: a worker receives the summed gradients of the variables it owns in the pack, and
nothing else. It applies its optimizer to them (gradient clipping by global norm takes the norm over every
worker's shard: one scalar crosses), then each pack's updated values are all-gathered from their owners, so
every replica is whole and equal again before the next step. The bytes that cross are an all-reduce's.
Imported only in training processes.
"""

import numpy as np
import tensorflow as tf

from tfbarrier.errors import ModelError
from tfbarrier.exchange.ring_hooks import packing, packs, shaped
from tfbarrier.keras_helpers import inner_optimizer

def owners(variables, size):
    """{id(variable): the rank that owns it} for ``variables`` (the same list on every worker): the largest
    first, each to the rank that owns the fewest bytes so far, so that every rank's slots weigh about the same."""
    nbytes = [int(np.prod(tuple(v.shape))) * tf.as_dtype(v.dtype).size for v in variables]
    loads, owner = [0] * size, {}
    for index in sorted(range(len(variables)), key=lambda i: -nbytes[i]):
        rank = loads.index(min(loads))
        owner[id(variables[index])] = rank
        loads[rank] += nbytes[index]
    return owner


def shard_updates(optimizer, ring, flavor, owner, options=None, exchanged=None, last_layers_first=True):
    """Make ``optimizer`` (of the ``flavor``'s Keras, built over the variables ``owner`` gives this rank) update
    only this worker's variables, from their gradients summed across ``ring``, and every worker's replica whole
    again after it (see the module). ``exchanged``: as ring_hooks.exchange_gradients'. Returns what
    FitResult.workers reports of it."""
    _check_shardable(optimizer)
    pack_bytes, dtype, share, described = packing(options, ring)
    clipnorm = _take_global_clipnorm(optimizer)

    def step(apply, grads, variables):
        if variables is None:
            raise ModelError("with communication={'shard': 'optimizer'}, the optimizer must be given the variables "
                             "it updates (optimizer.apply(grads, variables))")
        if exchanged is not None:
            exchanged.update(id(v) for v in variables)
        _refuse_sparse(grads, variables)
        dense = [(i, shaped(grad, variables, i)) for i, grad in enumerate(grads)
                 if grad is not None][::-1 if last_layers_first else 1]
        ranked = [sorted(pack, key=lambda entry: owner[id(variables[entry[0]])]) for pack in packs(dense, pack_bytes)]
        mine, after = _reduce_scattered(ranked, variables, owner, ring, dtype, share)
        indices = sorted(mine)
        owned_grads, owned = [mine[i] for i in indices], [variables[i] for i in indices]
        if clipnorm:
            owned_grads, after = _clipped(owned_grads, clipnorm, ring, after)
        with tf.control_dependencies(after):
            if owned:
                apply(owned_grads, owned)
            else:  # as the optimizers of the other workers count the step
                optimizer.iterations.assign_add(1)
        _all_gathered(ranked, variables, owner, ring)

    flavor.wrap_step(optimizer, step)
    return dict(described, shard="optimizer")


def _sizes(pack, variables, owner, size):
    """The values of each rank's variables in ``pack`` (ranked by owner)."""
    sizes = [0] * size
    for index, grad in pack:
        sizes[owner[id(variables[index])]] += grad.shape.num_elements()
    return sizes


def _reduce_scattered(ranked, variables, owner, ring, dtype, share):
    """{index: this worker's summed share of the gradient} for the variables it owns, each pack of ``ranked``
    reduce-scattered in turn; and the last exchange, which the next must follow."""
    mine, after = {}, []
    for pack in ranked:
        sizes = _sizes(pack, variables, owner, ring.size)
        with tf.control_dependencies(after):
            flat = tf.concat([tf.reshape(tf.cast(grad, dtype) * tf.cast(share, dtype), [-1]) for _, grad in pack], 0)
            chunk = tf.numpy_function(lambda values, sizes=sizes: ring.reduce_scatter(values, sizes), [flat], dtype,
                                      stateful=True)
        after = [chunk]
        owned = [(index, grad) for index, grad in pack if owner[id(variables[index])] == ring.rank]
        pieces = tf.split(chunk, [grad.shape.num_elements() for _, grad in owned]) if len(owned) > 1 else [chunk]
        for (index, grad), piece in zip(owned, pieces):
            mine[index] = tf.cast(tf.reshape(piece, grad.shape), grad.dtype)
    return mine, after


def _all_gathered(ranked, variables, owner, ring):
    """Every variable of the packs another worker owns given its owner's updated value (in the pack's widest
    float); this worker's own values are sent as they lie."""
    for pack in ranked:
        sizes = _sizes(pack, variables, owner, ring.size)
        held = [variables[index] for index, _ in pack]
        dtype = tf.float64 if any(tf.as_dtype(v.dtype) == tf.float64 for v in held) else tf.float32
        ours = [tf.reshape(tf.cast(tf.convert_to_tensor(v), dtype), [-1]) for v in held if owner[id(v)] == ring.rank]
        ours = ours[0] if len(ours) == 1 else tf.concat(ours, 0) if ours else tf.zeros([0], dtype)
        others = tf.numpy_function(lambda values, sizes=sizes: ring.all_gather_chunks(values, sizes), [ours], dtype,
                                   stateful=True)
        theirs = [v for v in held if owner[id(v)] != ring.rank]
        values = tf.split(others, [int(np.prod(tuple(v.shape))) for v in theirs]) if len(theirs) > 1 else [others]
        for variable, value in zip(theirs, values):
            variable.assign(tf.cast(tf.reshape(value, tuple(variable.shape)), variable.dtype))


def _clipped(grads, clipnorm, ring, after):
    """``grads`` scaled as clipping every worker's shard together by their global norm ``clipnorm`` would."""
    local = tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in grads]) if grads else tf.zeros([])
    with tf.control_dependencies(after):
        total = tf.numpy_function(ring.all_reduce_sum, [tf.reshape(local, [1])], tf.float32, stateful=True)
    scale = clipnorm / tf.maximum(tf.sqrt(tf.reshape(total, [])), clipnorm)
    return [g * tf.cast(scale, g.dtype) for g in grads], [total]


def _take_global_clipnorm(optimizer):
    """The optimizer's ``global_clipnorm``, turned off on it: the norm must be every shard's, not this worker's."""
    clipnorm = getattr(optimizer, "global_clipnorm", None)
    if clipnorm:
        optimizer.global_clipnorm = None
    return clipnorm


def _check_shardable(optimizer):
    if inner_optimizer(optimizer) is not optimizer:
        raise ModelError(
            f"communication={{'shard': 'optimizer'}} cannot shard a {type(optimizer).__name__}: it decides each step "
            "from every gradient (a loss scale skips the step when any is not finite), which no worker holds; drop "
            "the shard, or train without mixed precision's loss scaling")
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise ModelError("communication={'shard': 'optimizer'} does not shard an optimizer that accumulates gradients "
                         "(gradient_accumulation_steps): drop one of them")


def _refuse_sparse(grads, variables):
    sparse = [getattr(variables[i], "path", variables[i].name) for i, g in enumerate(grads)
              if isinstance(g, tf.IndexedSlices)]
    if sparse:
        raise ModelError(
            f"communication={{'shard': 'optimizer'}} does not shard {', '.join(sparse)} yet: an embedding's gradient "
            "is sparse (rows, not the whole table). Drop the shard, or freeze the embedding (a LoRA fine-tune does)")
