"""What every floor above needs to know of Keras and TensorFlow objects: the optimizer that updates the weights
(past a LossScaleOptimizer), variables that take the initial value each worker computes itself, and a model
saved without its optimizer's state.

MultiWorkerMirroredStrategy gives every variable worker 0's initial value: one broadcast per variable, the whole
model through gRPC, whose receiving side holds about three copies of each message at once. Where every worker
makes the same values itself (a model object's weights, read from the same file right after; an optimizer's
slots, zeros), ``initial_values_local`` skips it.
"""

import contextlib


def inner_optimizer(optimizer):
    """The optimizer that updates the weights: ``optimizer``, or the one a LossScaleOptimizer wraps."""
    return getattr(optimizer, "inner_optimizer", optimizer)


@contextlib.contextmanager
def initial_values_local(strategy):
    """Variables made inside take the initial value each worker computes itself instead of worker 0's
    broadcast: only for values that are the same on every worker. A no-op with no strategy or where
    TensorFlow's MultiWorkerMirroredStrategy is not as this module knows it (then it broadcasts)."""
    extended = getattr(strategy, "extended", None)
    local = _local_initial_value(extended)
    if local is None:
        yield
        return
    extended._get_variable_creator_initial_value = local  # shadows the class's method on this instance only
    try:
        yield
    finally:
        del extended._get_variable_creator_initial_value


def _local_initial_value(extended):
    """MirroredStrategy's initial value (the worker's own), bound to ``extended``: what
    MultiWorkerMirroredStrategy's extends with worker 0's broadcast; None if ``extended`` is not one."""
    try:
        from tensorflow.python.distribute.collective_all_reduce_strategy import CollectiveAllReduceExtended
    except ImportError:
        return None
    if not isinstance(extended, CollectiveAllReduceExtended) or "_get_variable_creator_initial_value" in vars(extended):
        return None
    return getattr(super(CollectiveAllReduceExtended, extended), "_get_variable_creator_initial_value", None)


@contextlib.contextmanager
def optimizer_state_left_out(model, leave_out=True):
    """Inside, ``model`` holds an unbuilt copy of its optimizer, so an archive saved there holds none of the
    optimizer's state (what an archive of a model that never trained holds): where each worker holds a shard of
    that state (communication's ``shard``), no worker's is whole. Without ``leave_out``, nothing changes."""
    if not leave_out:
        yield model
        return
    optimizer = model.optimizer
    model.optimizer = type(optimizer).from_config(optimizer.get_config())
    try:
        yield model
    finally:
        model.optimizer = optimizer


@contextlib.contextmanager
def unbuilt_optimizer_unwarned():
    """Inside, Keras 3 does not warn that an archive's optimizer holds none of its variables: one saved under
    ``optimizer_state_left_out`` holds none, and nothing is lost (its slots start at zero when it first trains)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        yield
