"""Which pieces of the trainable weights a worker updates where the optimizer's state is sharded (fit's
``communication={"shard": "optimizer"}``, sharded_update.py): the variables it holds whole, and for each block of
rows it holds of a cut variable (placement.py) a variable of its own holding them, so that the model's own
optimizer, built over them, keeps the slots of about 1/N of the weights; and the check after the first step that
the exchange's writes reached every worker's copy.
Imported only in training processes.
"""

import numpy as np
import tensorflow as tf
import tf_keras

from tfbarrier.errors import ModelError
from tfbarrier.exchange.placement import pieces
from tfbarrier.exchange.ring import rows_per_segment


class Shards:
    """This worker's share of ``variables`` (the trainable ones, in the same order on every worker): each
    variable's pieces (``placed``: placement.pieces'), and ``updated``, what this worker's optimizer updates (a
    variable it holds whole, or the block variable of a block it holds)."""

    def __init__(self, variables, rank, size):
        shapes = [tuple(int(d) for d in v.shape) for v in variables]
        placed = pieces(shapes, [tf.as_dtype(v.dtype).size for v in variables], size)
        self.rank, self.placed = rank, {id(v): p for v, p in zip(variables, placed)}
        self._variables = {id(v): v for v in variables}
        self.blocks, self.updated = {}, []  # {(id(variable), start): its block variable}
        for variable in variables:
            for holder, start, stop in self.placed[id(variable)]:
                if holder != rank:
                    continue
                if not self.is_cut(variable):
                    self.updated.append(variable)
                else:
                    self.blocks[id(variable), start] = _block_variable(variable, start, stop)
                    self.updated.append(self.blocks[id(variable), start])

    def sync(self):
        """Each block variable given its rows as the model has them now (a checkpoint's restore, the chief's drawn
        values): the blocks are the truth between steps, written into the model after each update."""
        for (key, start), block in self.blocks.items():
            block.assign(_rows(self._variables[key], start, start + int(block.shape[0])))

    def unwritten(self):
        """The cut variables whose rows this worker updated are not its blocks' values: the step's write into the
        variable (``_gathered_into``) did not reach it."""
        return [self._variables[key] for (key, start), block in self.blocks.items()
                if not _holds_rows(self._variables[key], start, block)]

    def is_cut(self, variable):
        """Whether ``variable`` is cut into blocks of rows, one a worker."""
        return len(self.placed[id(variable)]) > 1

    def weights_held(self):
        """The weights whose optimizer state this worker holds."""
        return sum(int(np.prod(tuple(v.shape))) for v in self.updated)

    def cut(self, pack, variables):
        """``pack``'s gradients as pieces (holder, index, start, stop, shape), ranked by their holder, and the pack
        as it travels: one flat tensor of the pieces in that order (the gradient as it lies, for a pack of one cut
        variable, whose blocks are in the ranks' order: no copy of its rows)."""
        cut = []
        for index, grad in pack:
            whole = not self.is_cut(variables[index])
            cut += [(holder, index, start, stop, tuple(grad.shape if whole else [stop - start, *grad.shape[1:]]))
                    for holder, start, stop in self.placed[id(variables[index])]]
        if len(pack) == 1:
            return cut, [pack[0][1]]
        grads = dict(pack)
        cut.sort(key=lambda piece: piece[0])
        return cut, [grads[index] if not self.is_cut(variables[index]) else grads[index][start:stop]
                     for _, index, start, stop, _ in cut]

    def target(self, variables, index, start):
        """What this worker's optimizer updates for the piece of ``variables[index]`` starting at row ``start``."""
        return self.blocks.get((id(variables[index]), start), variables[index])


class SyncBlocks(tf_keras.callbacks.Callback):
    """After every other callback's start of a fit (a checkpoint's restore among them): the blocks as the model's
    weights now are (``Shards.sync``). After the first call: every trainable variable equal on every worker across
    ``ring`` (their checksums; the exchange writes most where they lie) and each block's rows found written into its
    variable, or the fit fails in words: a variable TensorFlow copies at every read (copy-on-read mode: after a
    lookup of it) or a TensorFlow that handed the exchange a copy would lose the write (``_gathered_into``)."""

    def __init__(self, shards, ring):
        super().__init__()
        self.shards, self.ring, self.checked = shards, ring, False

    def on_train_begin(self, logs=None):
        self.shards.sync()

    def on_train_batch_end(self, batch, logs=None):
        if self.checked:
            return
        self.checked = True
        drifted = [getattr(v, "path", v.name) for v in self.ring.differing(self.model.trainable_variables)]
        if drifted:
            raise ModelError(
                f"with communication={{'shard': 'optimizer'}}, the workers' copies of {', '.join(drifted)} differ "
                "after the first step: the other workers' updates did not reach them (the exchange writes them where "
                f"this TensorFlow, {tf.__version__}, keeps the variable; a callback that changes a weight on one "
                "worker alone does the same). Drop the shard (communication={'shard': 'none'})")
        unwritten = [getattr(v, "path", v.name) for v in self.shards.unwritten()]
        if self.ring.all_reduce_sum(np.array([float(len(unwritten))]))[0]:  # on every worker, or on none
            raise ModelError(
                f"with communication={{'shard': 'optimizer'}}, {', '.join(unwritten) or 'a weight'} did not take "
                "its updated rows: TensorFlow copies it at every read (a lookup of it, as an embedding's, puts a "
                "variable in that mode for good), so the exchange wrote them into a copy and it would not train. "
                "Drop the shard (communication={'shard': 'none'}), or freeze it")


def _block_variable(variable, start, stop):
    """A variable holding ``variable``'s rows ``start:stop``, of its Keras's kind and name (an optimizer's slots
    and its weight decay's exclusions go by names)."""
    rows = _rows(variable, start, stop)
    if hasattr(variable, "path"):  # Keras 3's
        return type(variable)(initializer=rows, dtype=variable.dtype, trainable=False, name=variable.name)
    return tf.Variable(rows, trainable=False, name=variable.name.split(":")[0])


def _holds_rows(variable, start, block):
    """Whether ``variable``'s rows from ``start`` are ``block``'s values (NaN where NaN), compared a segment of rows
    at a time: neither is copied whole above the step's peak."""
    values, rows = tf.convert_to_tensor(variable), tf.convert_to_tensor(block)
    count = int(block.shape[0])
    segment = rows_per_segment(tuple(block.shape))
    for first in range(0, count, segment):
        last = min(first + segment, count)  # the variable's rows past the block are another worker's
        mine, theirs = values[start + first:start + last], rows[first:last]
        if not bool(tf.reduce_all((mine == theirs) | (tf.math.is_nan(mine) & tf.math.is_nan(theirs)))):
            return False
    return True


def _rows(variable, start, stop):
    return tf.convert_to_tensor(variable)[start:stop]
