"""The optimizer's state sharded over tfbarrier's ring (fit's ``communication={"shard": "optimizer"}``): ZeRO's
stage 1, and its stage 2 for the gradients' memory (the backward pass held a few packs ahead of the exchanges).

Each trainable variable's optimizer state is held by one worker, or, for a large variable cut into blocks of rows,
each block's by one worker (placement.py: every worker's pieces weigh about the same). A worker's optimizer (the
model's own) is built over what it holds alone: the variables it holds whole, and for each block a variable of its
own holding that block's rows (shards.py's ``Shards``), so it keeps the slots of about 1/N of the weights. A step's
gradients cross the ring in packs, last layers first, as ring_hooks.exchange_gradients sends them, but each pack is
reduce-scattered instead of all-reduced: a worker receives the summed gradients of its own pieces in the pack, and
nothing else. It applies its optimizer to them pack by pack, and each pack's updated values are all-gathered from
their holders while the backward pass still makes the next packs, as an all-reduce's second half would be
(``_updated_pack_by_pack``; clipping by global norm takes the norm over every worker's pieces, one scalar across,
and an optimizer's moving average (EMA) every weight's, so there it applies once, after every pack:
``_updated_at_once``), so every replica is whole and equal again before the next step; on a CPU, a pack of one
variable is received straight into the variable once the backward pass is done (``_gathered_into``: no buffer, no
copy). The bytes that cross are an all-reduce's. A pack's full gradients are freed once it is reduce-scattered,
and the backward pass makes a pack's gradients only once the exchange of the pack PACKS_AHEAD before it is done
(``held_back``), so a worker holds a few packs and the summed shares not yet applied, not every gradient of the
step.
Imported only in training processes.
"""

import numpy as np
import tensorflow as tf

from tfbarrier.errors import ModelError
from tfbarrier.exchange.base import PACKS_AHEAD, TAKEN_CLIPNORM, applies_once
from tfbarrier.exchange.ring_hooks import packing, packs, shaped
from tfbarrier.keras_helpers import inner_optimizer


def shard_updates(optimizer, ring, flavor, shards, options=None, exchanged=None, last_layers_first=True):
    """Make ``optimizer`` (of the ``flavor``'s Keras, built over ``shards.updated``) update only this worker's
    pieces, from their gradients summed across ``ring``, and every worker's replica whole again after it (see the
    module). ``exchanged``: as ring_hooks.exchange_gradients'. Returns what FitResult.workers reports of it."""
    _check_shardable(optimizer)
    pack_bytes, dtype, share, described = packing(options, ring)
    once = applies_once(optimizer)
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
        exchange = _StepExchange(ring, shards, variables, list(packs(dense, pack_bytes)), dtype, share)
        if once:
            _updated_at_once(exchange, apply, optimizer, clipnorm)
        else:
            _updated_pack_by_pack(exchange, apply, optimizer)

    flavor.wrap_step(optimizer, step)
    return dict(described, shard="optimizer")


class _StepExchange:
    """A traced step's packs of gradients (``packed``, as ring_hooks.packs made them) as they cross ``ring``: each
    pack's pieces (Shards.cut) reduce-scattered, and all-gathered once their holders updated them."""

    def __init__(self, ring, shards, variables, packed, dtype, share):
        self.ring, self.shards, self.variables, self.packed = ring, shards, variables, packed
        self.dtype, self.share, self.ancestors = dtype, share, set()
        self.cut = [shards.cut(pack, variables) for pack in packed]
        self.on_cpu = not tf.config.list_logical_devices("GPU")  # a GPU's variable reaches Python as a copy
        sent = {index for pack in packed for index, _ in pack}
        self.into = _written_where_they_lie(variables, sent) if self.on_cpu else set()

    def reduce_scattered(self, number, after):
        """{(index, start): this worker's summed share of the gradient} for its pieces in pack ``number``, and
        the exchange, which follows ``after`` (the exchange before it); the backward pass's making of the pack
        PACKS_AHEAD after it is held back until it is done (``held_back``)."""
        pieces_, parts = self.cut[number]
        sizes = _sizes(pieces_, self.ring.size)
        with tf.control_dependencies(after):
            flat = tf.concat([tf.reshape(tf.cast(part, self.dtype) * tf.cast(self.share, self.dtype), [-1])
                              for part in parts], 0)
            # a cut variable's chunk kept in its gradient's buffer: a copy would be made while the buffer lives
            chunk = tf.numpy_function(lambda values, view=_one_cut(pieces_): self.ring.reduce_scatter(
                values, sizes, view), [flat], self.dtype, stateful=True)
        if number + PACKS_AHEAD < len(self.packed):
            held_back(self.packed[number + PACKS_AHEAD], chunk, self.ancestors)
        owned = [piece for piece in pieces_ if piece[0] == self.ring.rank]
        split = tf.split(chunk, [int(np.prod(piece[4])) for piece in owned]) if len(owned) > 1 else [chunk]
        return {(index, start): tf.reshape(part, shape)
                for (_, index, start, _, shape), part in zip(owned, split)}, chunk

    def updates(self, shares):
        """(the gradients, the variables) of this worker's optimizer for ``shares`` (reduce_scattered's)."""
        return ([tf.cast(grad, self.variables[index].dtype) for (index, _), grad in shares.items()],
                [self.shards.target(self.variables, index, start) for index, start in shares])

    def gathered_in_place(self, number):
        """Whether pack ``number`` is one variable, whole or its blocks, received straight into the variable
        (``_gathered_into``): only once the backward pass, which reads the variable, is done. A cut variable's
        always is on a CPU (shards.SyncBlocks finds a write that missed)."""
        indices = {index for _, index, _, _, _ in self.cut[number][0]}
        if len(indices) != 1:
            return False
        index = indices.pop()
        return index in self.into or (self.on_cpu and self.shards.is_cut(self.variables[index]))

    def all_gathered(self, number, after):
        """Pack ``number`` all-gathered after ``after`` (a worker's updated pieces are read after its optimizer
        wrote them: a traced step reads a variable after its writes): in place (``_gathered_into``), or through
        a buffer of the pieces other workers hold (``_gathered_through``). Returns the exchange."""
        pieces_ = self.cut[number][0]
        with tf.control_dependencies(after):
            if self.gathered_in_place(number):
                return _gathered_into(self.variables[pieces_[0][1]], pieces_, self.shards, self.ring)
            return _gathered_through(pieces_, self.variables, self.shards, self.ring)


def _updated_at_once(exchange, apply, optimizer, clipnorm):
    """Every pack reduce-scattered, then the optimizer applied once to this worker's pieces (their gradients
    clipped by the norm over every worker's, ``clipnorm``), then every pack all-gathered."""
    shares, after = {}, []
    for number in range(len(exchange.cut)):
        pack_shares, chunk = exchange.reduce_scattered(number, after)
        shares.update(pack_shares)
        after = [chunk]
    grads, owned = exchange.updates(shares)
    if clipnorm:
        grads, after = _clipped(grads, clipnorm, exchange.ring, after)
    with tf.control_dependencies(after):
        if owned:
            apply(grads, owned)
        else:  # as the optimizers of the other workers count the step
            optimizer.iterations.assign_add(1)
    for number in range(len(exchange.cut)):
        after = [exchange.all_gathered(number, after)]


def _updated_pack_by_pack(exchange, apply, optimizer):
    """Each pack's pieces updated as soon as it is reduce-scattered, and the pack all-gathered after the next
    one's reduce-scatter (its update runs meanwhile): the all-gathers cross the ring while the backward pass runs,
    as an all-reduce's second half does, not after it. The optimizer is applied once a pack and counts the step
    once (its ``iterations``, which its learning rate and Adam's bias correction read, set back after each apply
    and counted at the end: the same update as one apply). A pack gathered in place waits for the last."""
    after, waiting, in_place = [], None, []
    for number in range(len(exchange.cut)):
        shares, chunk = exchange.reduce_scattered(number, after)
        after = [chunk]
        if shares:
            with tf.control_dependencies(after):
                apply(*exchange.updates(shares))
                optimizer.iterations.assign_sub(1)
        if waiting is not None:
            after = [exchange.all_gathered(waiting, after)]
        waiting = None if exchange.gathered_in_place(number) else number
        if waiting is None:
            in_place.append(number)
    for number in ([] if waiting is None else [waiting]) + in_place:
        after = [exchange.all_gathered(number, after)]
    optimizer.iterations.assign_add(1)


def _sizes(pieces, size):
    """The values each rank holds of ``pieces`` (a pack's, ranked by holder)."""
    sizes = [0] * size
    for holder, _, _, _, shape in pieces:
        sizes[holder] += int(np.prod(shape))
    return sizes


def held_back(pack, exchange, ancestors):
    """Make the backward pass's operations that take the gradient flowing into ``pack``'s gradients wait for
    ``exchange`` (an earlier pack's), where that makes no cycle: none that ``exchange`` itself waits for
    (``ancestors``: the operations found so far that the exchanges wait for, grown here). In a traced step only;
    TensorFlow has no public way to order operations already made, hence ``_add_control_input`` (a TensorFlow
    without it holds nothing back: stage 1's memory; test_sharded fails). Returns how many operations now wait."""
    if tf.executing_eagerly() or not hasattr(tf.Operation, "_add_control_input"):
        return 0
    _add_ancestors(exchange.op, ancestors)
    held = 0
    for _, grad in pack:
        for flowing in _made_by(grad.op).inputs:
            for consumer in flowing.consumers() if flowing.dtype.is_floating else ():
                if consumer not in ancestors and exchange.op not in consumer.control_inputs:
                    consumer._add_control_input(exchange.op)
                    held += 1
    return held


def _made_by(op):
    """The operation that computed a gradient ``op`` passes on (through identities, casts and reshapes)."""
    while op.type in ("Identity", "Cast", "Reshape") and op.inputs:
        op = op.inputs[0].op
    return op


def _add_ancestors(op, found):
    """Every operation ``op`` waits for, by its inputs or its control inputs, added to ``found``."""
    stack = [op]
    while stack:
        current = stack.pop()
        if current in found:
            continue
        found.add(current)
        stack.extend(tensor.op for tensor in current.inputs)
        stack.extend(current.control_inputs)


def _one_cut(pieces_):
    """Whether a pack's ``pieces_`` are the blocks of one cut variable (in the ranks' order)."""
    return len(pieces_) > 1 and len({index for _, index, _, _, _ in pieces_}) == 1


def _gathered_into(variable, pieces_, shards, ring):
    """``variable``'s updated values (its pieces': the whole variable's, or the blocks of a cut one) written where
    it lies: a block this worker updated copied from its block variable into its rows, the others' pieces received
    from the ring straight into the variable's buffer, which the step's read of it hands the exchange (no copy of
    the variable, no buffer of the others' pieces: a fresh buffer costs its page faults on every step, and an
    assign, or a sliced one, copies it again). The backward pass, the last reader of the variable in the step, is
    done: every pack's reduce-scatter came before. shards.SyncBlocks checks after the first step that the workers'
    copies are equal (the write reached the variable)."""
    sizes = _sizes(pieces_, ring.size)
    mine = [piece for piece in pieces_ if piece[0] == ring.rank and shards.is_cut(variable)]
    block = shards.blocks[id(variable), mine[0][2]] if mine else None
    row = int(np.prod(variable.shape[1:]))

    def gather(rows, whole):
        flat = whole.reshape(-1)
        if mine:
            flat[mine[0][2] * row:mine[0][3] * row] = rows.reshape(-1)
        ring.all_gather_into(flat, sizes)
        return np.zeros(0, np.int8)

    rows = tf.convert_to_tensor(block) if mine else tf.zeros([0], variable.dtype)
    return tf.numpy_function(gather, [rows, tf.convert_to_tensor(variable)], tf.int8, stateful=True)


def _written_where_they_lie(variables, indices):
    """Those ``indices`` of ``variables`` whose reads in the step being traced hand out their buffer: those read
    whole alone. A row-at-a-time read (an embedding's lookup in tf_keras) leaves TensorFlow copying the variable
    at every read, and a call of a function or a loop may hold one; a step run eagerly is not traced: none."""
    if tf.executing_eagerly():
        return set()
    graph = tf.compat.v1.get_default_graph()
    return {i for i in indices
            if all(op.type == "ReadVariableOp" for op in graph.capture(variables[i].handle).consumers())}


def _gathered_through(pieces_, variables, shards, ring):
    """Every piece of a pack another worker holds given its holder's updated value (in the pack's widest
    float), and each block this worker updated written into its variable's rows; this worker's own values are
    sent as they lie. Returns the exchange."""
    sizes = _sizes(pieces_, ring.size)
    dtype = tf.float64 if any(tf.as_dtype(variables[p[1]].dtype) == tf.float64 for p in pieces_) else tf.float32
    ours = [tf.reshape(tf.cast(tf.convert_to_tensor(shards.target(variables, index, start)), dtype), [-1])
            for holder, index, start, _, _ in pieces_ if holder == ring.rank]
    ours = ours[0] if len(ours) == 1 else tf.concat(ours, 0) if ours else tf.zeros([0], dtype)
    others = tf.numpy_function(lambda values, sizes=sizes: ring.all_gather_chunks(values, sizes), [ours], dtype,
                               stateful=True)
    theirs = [piece for piece in pieces_ if piece[0] != ring.rank]
    values = tf.split(others, [int(np.prod(piece[4])) for piece in theirs]) if len(theirs) > 1 else [others]
    for (_, index, start, stop, shape), value in zip(theirs, values):
        _write(variables[index], start, stop, tf.reshape(value, shape), shards.is_cut(variables[index]))
    for holder, index, start, stop, _ in pieces_:
        block = shards.blocks.get((id(variables[index]), start))
        if holder == ring.rank and block is not None:
            _write(variables[index], start, stop, tf.convert_to_tensor(block), cut=True)
    return others


def _write(variable, start, stop, value, cut):
    """``value`` into ``variable``: whole, or, where it is ``cut`` into blocks, into its rows ``start:stop`` in
    place."""
    value = tf.cast(value, variable.dtype)
    if not cut:
        variable.assign(value)
    else:
        tf.raw_ops.ResourceStridedSliceAssign(ref=variable.handle, begin=[start], end=[stop], strides=[1], value=value)


def _clipped(grads, clipnorm, ring, after):
    """``grads`` scaled as clipping every worker's shard together by their global norm ``clipnorm`` would."""
    local = tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in grads]) if grads else tf.zeros([])
    with tf.control_dependencies(after):
        total = tf.numpy_function(ring.all_reduce_sum, [tf.reshape(local, [1])], tf.float32, stateful=True)
    scale = clipnorm / tf.maximum(tf.sqrt(tf.reshape(total, [])), clipnorm)
    return [g * tf.cast(scale, g.dtype) for g in grads], [total]


def _take_global_clipnorm(optimizer):
    """The optimizer's ``global_clipnorm``, turned off on it (the norm must be every shard's, not this worker's) and
    kept beside it (``TAKEN_CLIPNORM``: the memory check reads it)."""
    clipnorm = getattr(optimizer, "global_clipnorm", None)
    if clipnorm:
        optimizer.global_clipnorm = None
        setattr(optimizer, TAKEN_CLIPNORM, clipnorm)
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
