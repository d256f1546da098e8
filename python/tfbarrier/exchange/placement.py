"""Which worker holds the optimizer's state of which weights, where the workers shard it (fit's
``communication={"shard": "optimizer"}``): arithmetic on the trainable variables' shapes alone, the same in
every training process (sharded_update.py) and on the driver (models/memory.py's check).

A variable larger than half a worker's fair share (SPLIT_FROM of the trainable bytes over N) is cut into N
blocks of rows, one per worker, as ZeRO and FSDP cut a flat parameter: a model of one large matrix (an
embedding, a wide layer) then spreads its slots as evenly as a model of many. Every other variable goes whole to
the worker holding the fewest bytes so far, the largest first (PyTorch's ZeroRedundancyOptimizer's grain), so
that each worker's pieces weigh about the same.
"""

import math

SPLIT_FROM = 0.5  # of the fair share (trainable bytes / N): a variable this large is cut into N row blocks


def pieces(shapes, itemsizes, size):
    """For each variable (``shapes`` and their ``itemsizes``, in the model's order): its pieces as
    ``(rank, start, stop)``, a block of rows ``start:stop`` whose optimizer state ``rank`` holds; a variable
    held whole is one piece of all its rows (``stop`` None for a scalar)."""
    nbytes = [math.prod(shape) * itemsize for shape, itemsize in zip(shapes, itemsizes)]
    fair = sum(nbytes) / size
    placed, loads = [None] * len(shapes), [0] * size
    split = [i for i, shape in enumerate(shapes)
             if size > 1 and len(shape) and shape[0] >= size and nbytes[i] > SPLIT_FROM * fair]
    for index in split:  # block k to worker k: a pack of one cut variable is its gradient as it lies, in ranks' order
        rows = shapes[index][0]
        bounds = [rows * k // size for k in range(size + 1)]
        placed[index] = [(k, bounds[k], bounds[k + 1]) for k in range(size)]
        for rank, start, stop in placed[index]:
            loads[rank] += nbytes[index] * (stop - start) // rows
    for index in sorted((i for i in range(len(shapes)) if placed[i] is None), key=lambda i: -nbytes[i]):
        rank = loads.index(min(loads))
        placed[index] = [(rank, 0, shapes[index][0] if len(shapes[index]) else None)]
        loads[rank] += nbytes[index]
    return placed


def held(shapes, itemsizes, size):
    """(the most bytes of weights whose state one worker holds, the most bytes of cut blocks one worker holds):
    what the fullest worker's slots and its copies of its blocks (sharded_update's block variables) weigh."""
    owned, blocks = [0] * size, [0] * size
    for shape, itemsize, placed in zip(shapes, itemsizes, pieces(shapes, itemsizes, size)):
        row_bytes = math.prod(shape[1:]) * itemsize if len(shape) else itemsize
        for rank, start, stop in placed:
            part = row_bytes * ((stop - start) if stop is not None else 1)
            owned[rank] += part
            if len(placed) > 1:
                blocks[rank] += part
    return max(owned), max(blocks)
