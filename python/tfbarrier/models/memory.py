"""What a training process needs in memory, and what its executor can give it: ``fit`` refuses a model
that cannot fit, naming the numbers, instead of letting the kernel's OOM killer or a container's limit
end the job (or the machine) mid-way.

A training process holds TensorFlow itself (TENSORFLOW_BYTES), then, at its peak in a step: the weights and their
gradients (the exchange's ``step_copies`` of the trainable weights), copies of the largest variable's gradient, or
pack of gradients, as the exchange and the optimizer's update compute with it (its ``largest_copies``; under
MultiWorkerMirroredStrategy copies of every weight instead, and as many again of the first SMALL_MODEL_BYTES, which
TensorFlow's allocator keeps: ``small_model_copies``); the optimizer's slots (none for plain SGD, one copy of the
trainable weights with momentum, two for Adam...; their updates' temporaries fit in what the step holds, but for
plain SGD's in TensorFlow's BFC pool, which training processes use without oneDNN: POOLED_SGD_COPIES); and each
layer's output on a batch, kept for the backward pass with its gradient (ACTIVATION_COPIES). With the optimizer's
state sharded over N workers, a worker holds about 1/N of the slots, copies of the blocks of a cut variable it
updates, and of the gradients PACKS_AHEAD packs (the backward pass is held back: sharded_update.held_back) and the
summed shares of a pack (or its whole share, where its optimizer is applied once after every pack: applies_once). A
model whose layers' outputs do not tell their sizes (a transformer's sequence length, unknown until the data's
widths are) is traced instead, once the widths are known: what a step's
backward pass keeps of its forward pass, tensor by tensor (``kept_for_backward``), and its graph, by the operations
of the traced step (GRAPH_BYTES_PER_OP: what running so large a graph holds outside TensorFlow's allocator). A model
that trains natively (Keras 3) holds Keras 3 besides (KERAS3_BYTES); its weights, loaded a variable at a time (a
preset's, or a model object's archive: native_model.load_archive), are held once. The constants come from the peaks
of real 2-worker fits (bench/memory_estimate_bench.py: MLPs of 12 to 300 M parameters, mostly one matrix, a 65 M
model of 16 layers, CNNs of 64x64 images; SGD, momentum and Adam); bench/README.md has the estimate beside each
peak. The estimate is the sum (``ModelSize.worker_bytes``).

What a worker can have: spark/worker_memory.py. ``spark.tfbarrier.memoryCheck=false`` turns both checks off.
"""

import dataclasses
import math
import sys

from tfbarrier import exchange as exchanges
from tfbarrier.exchange import placement
from tfbarrier.exchange.base import PACK_BYTES, PACKS_AHEAD, applies_once
from tfbarrier.errors import ModelError
from tfbarrier.keras_helpers import inner_optimizer
from tfbarrier.settings import MEMORY_CHECK_CONF, switched_on
from tfbarrier.spark.training_process import onednn_on
from tfbarrier.spark.worker_memory import HEADROOM_SAID, executor_budget, gb, usable_bytes

MIB = 2**20
TENSORFLOW_BYTES = 650 * MIB  # a training process with TensorFlow, tf_keras and a strategy, before any model
# a traced model's step (a transformer's), for each operation of its forward and backward pass: what TensorFlow
# holds to run a step of that graph besides its tensors (its kernels and their state, the optimized graph), none
# of it in TensorFlow's allocator: 57-89 KB an operation over the traced step of a 120 M Llama with LoRA, float32
# (4,876 operations) and int8 (8,269), in one process, at batches of 1 to 8 rows (bench/README.md, issue 74)
GRAPH_BYTES_PER_OP = 64 * 2**10
KERAS3_BYTES = 160 * MIB  # Keras 3 (and KerasHub) besides, for a model that trains natively (813 MB at its start)
DEFAULT_SLOTS = 2  # an optimizer this module does not know: assume Adam's
SMALL_MODEL_BYTES = 128 * MIB  # the strategy's step keeps as many copies again of this much of the weights
ACTIVATION_COPIES = 1.8  # a layer's output on a batch, kept for the backward pass, and its gradient
# Without oneDNN (a CPU without AVX-512's neural-network extensions), training processes use TensorFlow's BFC pool
# (settings.CPU_POOL_ENV), in which a plain SGD step (no slots) peaks about as high as a step with momentum's slot:
# 1.3-1.8 copies of the trainable weights more than step_copies says (bench/memory_estimate_bench.py on such a CPU,
# MLPs of 61 to 300 M parameters); with oneDNN's pool it did not (its runs at beab669).
POOLED_SGD_COPIES = 1.5
# The chief's trained model as a .keras archive (a model function's, a Keras 3 model object's): Keras builds its
# weights file in memory and copies it out, 2.3 copies of the weights, once the step's tensors are freed (a model
# function's fit of a 135 M MLP of 8 layers: its chief peaked 520 MB over the other worker; issue 74)
ARCHIVE_COPIES = 2.3


def optimizer_slots(optimizer):
    """Copies of each trainable weight ``optimizer`` (Keras 3 or tf_keras) keeps."""
    optimizer = inner_optimizer(optimizer)
    name = type(optimizer).__name__
    try:
        config = optimizer.get_config()
    except Exception:  # noqa: BLE001 - a custom optimizer: the default guess
        config = {}
    momentum = 1 if float(config.get("momentum") or 0) > 0 else 0
    if name == "SGD":
        return momentum
    if name in ("Adam", "AdamW", "Nadam"):
        return 2 + (1 if config.get("amsgrad") else 0)
    if name == "RMSprop":
        return 1 + momentum + (1 if config.get("centered") else 0)
    known = {"Adagrad": 1, "Adamax": 2, "Adadelta": 2, "Ftrl": 2, "Lion": 1, "Lamb": 2, "Adafactor": 1}
    return known.get(name, DEFAULT_SLOTS)


def _bytes(variables):
    return sum(math.prod(int(d) for d in v.shape) * _itemsize(v) for v in variables)


def _itemsize(variable):
    import numpy as np

    return np.dtype(getattr(variable.dtype, "name", variable.dtype)).itemsize


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """A model's bytes as a training process holds them."""

    weights: int  # every variable
    trainable: int  # the trainable ones: each has a gradient and the optimizer's slots
    slots: int  # the optimizer's copies of each trainable weight
    optimizer: str
    inputs: int = 0  # bytes of a sample's inputs
    activations: int = 0  # bytes of a sample's layer outputs (0 where the model does not tell them)
    exchange: object = None  # how its gradients travel (an Exchange); None: tfbarrier's ring, the default
    kept: tuple = None  # traced (bytes a sample, bytes whatever the batch) a step keeps for its backward pass
    native: bool = False  # trains in Keras 3 (KERAS3_BYTES)
    graph: int = 0  # bytes the traced step's graph takes, where the step was traced (GRAPH_BYTES_PER_OP)
    pooled: bool = False  # trains without oneDNN, in TensorFlow's BFC pool (POOLED_SGD_COPIES)
    archived: bool = False  # its chief writes the trained model as a .keras archive (ARCHIVE_COPIES)
    shapes: tuple = ()  # ((shape, bytes a value) of each trainable variable): where sharded slots lie (placement.py)
    slot_share: float = 1.0  # the share of the slots a worker holds (communication's shard: about 1/N)
    blocks: int = 0  # bytes of the copies of cut variables' blocks a worker holds to update them (sharded)
    applied_once: bool = False  # sharded, its optimizer is applied once after every pack (base.applies_once)

    @classmethod
    def of(cls, model, exchange=None, kept=None, native=False):
        """``model``'s size, as this process's TensorFlow would train it (with oneDNN or not)."""
        optimizer = getattr(model, "optimizer", None)
        return cls(weights=_bytes(model.weights), trainable=_bytes(model.trainable_weights),
                   slots=optimizer_slots(optimizer), optimizer=type(optimizer).__name__,
                   applied_once=optimizer is not None and applies_once(optimizer),
                   inputs=4 * _values(getattr(model, "inputs", None) or []), activations=4 * _activations(model),
                   exchange=exchange, kept=kept, native=native, pooled=onednn_on() is not True,
                   shapes=tuple((tuple(int(d) for d in v.shape), _itemsize(v)) for v in model.trainable_weights))

    def sharded(self, workers):
        """This size where ``workers`` share the optimizer's slots (communication's shard): each variable's slots,
        or each block's of a large one, on one worker, balanced by size (exchange/placement.py), so the fullest
        worker holds about 1/N of them, and a copy of the blocks it updates."""
        if not self.shapes or not self.trainable:
            return dataclasses.replace(self, slot_share=1.0)
        most, blocks = placement.held(*zip(*self.shapes), workers)
        return dataclasses.replace(self, slot_share=min(1.0, most / self.trainable), blocks=blocks)

    @classmethod
    def of_trained(cls, model, job, widths=None):
        """The size of ``model`` as ``job``'s training process built it, with what the driver traced of it, or,
        where the driver had no model to trace (a preset's), traced here from the shard's ``widths`` (values a
        row, or {input name: values a row})."""
        told = job.model.size  # what the driver told of the model (None: a model function's)
        kept = told and told.kept
        # a model function's too, when it built one (of a class of its own, whose module is the user's)
        native = job.model.native or ("keras" in sys.modules and isinstance(model, sys.modules["keras"].Model))
        size = cls.of(model, job.exchange, kept=kept, native=native)
        size = dataclasses.replace(size, archived=getattr(job.model, "flavor", None) == "function" or (
            native and not getattr(job.model, "adapters", ()) and not hasattr(job.model, "write_trained")))
        if kept is not None or widths is None:  # traced on the driver (its graph too), or nothing to trace here
            return size if kept is None else dataclasses.replace(size, graph=told.graph)
        return size.with_widths(model, input_shapes(model, widths if isinstance(widths, dict) else {None: widths}))

    def with_widths(self, model, shapes):
        """This size with what a step keeps traced, for a model whose outputs hide their sizes, its inputs'
        per-sample ``shapes`` ({input name: shape}) known from the data; itself where nothing is hidden."""
        if not _hides_sizes(model) or not shapes:
            return self
        traced = kept_for_backward(model, shapes)
        if traced is None:
            return self
        kept, operations = traced
        return dataclasses.replace(self, kept=kept, graph=GRAPH_BYTES_PER_OP * operations)

    def parts(self, rows):
        """What a training process holds at its peak, by part, in bytes, with batches of ``rows`` rows."""
        exchange = self.exchange or exchanges.named("tfbarrier")
        small = min(self.trainable, SMALL_MODEL_BYTES) if exchange.small_model_copies else 0
        largest = self._largest()
        step = exchange.step_copies * (self.trainable + small) + exchange.largest_copies * largest
        if self.slot_share < 1.0:  # sharded, the backward pass is held back (sharded_update.held_back): of the
            # gradients, a worker holds the packs made ahead of the ring and the summed shares it has not applied yet,
            # a pack's (a pack: at least the largest variable), or all of its share where it applies them at once
            unapplied = self.slot_share * self.trainable if self.applied_once else largest
            step -= self.trainable - min(self.trainable, unapplied + PACKS_AHEAD * largest)
        if self.pooled and not self.slots:
            step += POOLED_SGD_COPIES * self.trainable
        kept = (int(ACTIVATION_COPIES * self.activations * rows) if self.kept is None
                else self.kept[0] * rows + self.kept[1])
        return {"TensorFlow": TENSORFLOW_BYTES + (KERAS3_BYTES if self.native else 0),
                "weights, gradients and their exchange": int(step), "frozen weights": self.weights - self.trainable,
                f"{self.optimizer}'s slots ({self.slots} per weight{self._held()})": int(
                    self.slots * self.trainable * self.slot_share),
                "the blocks of weights it updates": self.blocks,
                "a batch's layer outputs" if self.kept is None else "what a batch's step keeps": kept,
                "the traced step's graph": self.graph,
                "the trained model's archive, past the step": self._archive(step),
                "a batch": self.inputs * rows}

    def _archive(self, step):
        """What writing the trained archive holds past what ``step`` held (its tensors are freed by then)."""
        return max(0, int(ARCHIVE_COPIES * self.weights - (step - self.trainable))) if self.archived else 0

    def _largest(self):
        """Bytes of the largest trainable variable, or of a pack of gradients (they travel joined); the whole
        trainable weights where their shapes are not known."""
        if not self.shapes:
            return self.trainable
        return max(max(math.prod(shape) * itemsize for shape, itemsize in self.shapes), min(self.trainable, PACK_BYTES))

    def _held(self):
        return "" if self.slot_share == 1.0 else f", {self.slot_share:.0%} of them on this worker"

    def worker_bytes(self, rows):
        return sum(self.parts(rows).values())

    def describe(self, rows):
        parts = ", ".join(f"{name} {gb(value)}" for name, value in self.parts(rows).items() if value)
        return f"{gb(self.worker_bytes(rows))} ({parts})"


def _values(tensors):
    """Values per sample of symbolic ``tensors`` (Keras 3 or tf_keras), those of unknown shape left out."""
    total = 0
    for tensor in tensors:
        shape = _sample_shape(tensor)
        if shape and None not in shape:
            total += math.prod(int(d) for d in shape)
    return total


def _sample_shape(tensor):
    """A symbolic tensor's shape past its batch dimension (None: a size only the data tells)."""
    return tuple(getattr(tensor, "shape", None) or ())[1:]


def _hides_sizes(model):
    """Whether ``model``'s inputs have sizes only the data tells (a sequence's length)."""
    return any(None in _sample_shape(t) for t in getattr(model, "inputs", None) or [])


def kept_for_backward(model, shapes):
    """((bytes a sample, bytes whatever the batch) of the tensors a training step's backward pass keeps
    from its forward pass, the operations of the step): the step traced (never run) at batches of one and two
    rows, its inputs of per-sample ``shapes``; None where it cannot be traced."""
    try:
        (one, operations), (two, _) = (_traced_kept(model, shapes, rows) for rows in (1, 2))
    except Exception:  # noqa: BLE001 - a model this tracing cannot call: the layers' rule stands
        return None
    return (max(0, two - one), max(0, 2 * one - two)), operations


def _traced_kept(model, shapes, rows):
    import tensorflow as tf

    inputs = list(model.inputs)
    specs = [tf.TensorSpec((rows, *shapes[_input_name(t)]), t.dtype) for t in inputs]
    forward = {}

    def step(*xs):
        with tf.GradientTape() as tape:
            outputs = model(dict(zip(map(_input_name, inputs), xs)) if len(xs) > 1 else xs[0], training=True)
            total = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32)) for o in _flatten(outputs)])
        forward.update((op.name, op) for op in tf.compat.v1.get_default_graph().get_operations())
        return tape.gradient(total, model.trainable_variables)

    graph = tf.function(step).get_concrete_function(*specs).graph
    kept = {t.name: t.shape.num_elements() * t.dtype.size for op in graph.get_operations() if op.name not in forward
            for t in op.inputs if t.op.name in forward and t.op.type not in _NOT_KEPT and t.dtype.is_floating
            and t.shape.is_fully_defined()}
    return sum(kept.values()), len(graph.get_operations())


_NOT_KEPT = {"ReadVariableOp", "Const", "Placeholder", "VarHandleOp", "Shape"}  # the weights themselves, no copies


def input_shapes(model, widths):
    """{input name: per-sample shape} of ``model``'s inputs, a dimension only the data tells (one None)
    filled from ``widths`` ({input name, or None for a model's one input: values a row}); {} where one
    is left unknown."""
    shapes = {}
    for tensor in getattr(model, "inputs", None) or []:
        shape = _sample_shape(tensor)
        width = widths.get(_input_name(tensor), widths.get(None))
        known = math.prod(int(d) for d in shape if d is not None)
        if shape.count(None) > 1 or (None in shape and (not width or width % known)):
            return {}
        shapes[_input_name(tensor)] = tuple(width // known if d is None else int(d) for d in shape)
    return shapes


def _input_name(tensor):
    return getattr(tensor, "name", "").split(":")[0]


def _activations(model):
    """Values per sample of the outputs of ``model``'s layers, nested models' layers included."""
    total = 0
    for layer in getattr(model, "layers", None) or []:
        if getattr(layer, "layers", None):
            total += _activations(layer)
            continue
        if type(layer).__name__ == "InputLayer":
            continue
        try:
            output = layer.output  # raises for a layer called more than once, or never
        except (AttributeError, ValueError, RuntimeError):
            continue
        total += _values(_flatten(output))
    return total


def _flatten(structure):
    if isinstance(structure, dict):
        return [t for value in structure.values() for t in _flatten(value)]
    if isinstance(structure, (list, tuple)):
        return [t for value in structure for t in _flatten(value)]
    return [structure]


def enabled(conf_get):
    return switched_on(conf_get, MEMORY_CHECK_CONF)


def check_on_driver(spark, size, rows, num_workers, exchange=None, sharded=False):
    """Refuse, before the stage, a model whose workers cannot fit where the driver can tell, its gradients
    travelling by ``exchange`` (None: tfbarrier's ring), the optimizer's slots shared by the workers where
    ``sharded``."""
    if size is None or not enabled(spark.conf.get):
        return
    if sharded:
        size = size.sharded(num_workers)
    budget = executor_budget(spark, num_workers)
    if budget is None:
        return
    can_have, why, fix = budget
    from tfbarrier.spark import cluster

    # executors on other machines may run without oneDNN where this driver runs with it: the larger count
    pooled = size.pooled or not cluster.on_this_machine(cluster.master(spark))
    _refuse_over(dataclasses.replace(size, exchange=exchange, pooled=pooled), rows, can_have, why, fix)


def check_on_host(size, rows, workers_on_host, already_held):
    """In a training process with its model built: refuse to start training when the rest of what it
    needs (what it does not hold yet, ``already_held`` bytes past TensorFlow being there) is more than
    its share of the host's available memory."""
    usable = usable_bytes()
    if usable is None:
        return
    share = usable // max(1, workers_on_host) + already_held
    _refuse_over(size, rows, share + TENSORFLOW_BYTES,
                 f"this host has {gb(usable)} available for the {workers_on_host} worker(s) on it {HEADROOM_SAID}",
                 "use fewer workers per host, a smaller model or batch, or hosts with more memory")


def _refuse_over(size, rows, can_have, why, fix):
    need = size.worker_bytes(rows)
    if need > can_have:
        raise ModelError(
            f"each training process needs about {size.describe(rows)}, but can have about {gb(can_have)}: "
            f"{why}. To fit: {fix}; or set {MEMORY_CHECK_CONF}=false to try anyway"
        )
