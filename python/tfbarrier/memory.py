"""What a training process needs in memory, and what its executor can give it: ``fit`` refuses a model
that cannot fit, naming the numbers, instead of letting the kernel's OOM killer or a container's limit
end the job (or the machine) mid-way.

A training process holds TensorFlow itself (TENSORFLOW_BYTES, measured on the benchmark machine),
the model's variables, the optimizer's slots (per trainable weight: none for plain SGD, one with
momentum, two for Adam...), the gradients, a batch, and TensorFlow's working memory: the temporaries
of a step (the all-reduce's pieces of the gradients and their sums, the gradients joined again...),
which TensorFlow's allocator (oneDNN's pool) keeps once it has them. That last part was measured
(bench/large_model_bench.py, an MLP of 61 M parameters, 233 MB of weights: a training process's peak
1.31-1.48 GB above its TensorFlow baseline with SGD, 1.90-2.15 GB with Adam, at most 2.44 GB over two
runs; one plain tf_keras process, no strategy, 1.40 GB and 1.53 GB), up to 6.5 times the trainable weights beyond the
weights, slots and gradients, and is taken as WORKING_COPIES x the trainable weights. The estimate is
the sum (``ModelSize.worker_bytes``).

What a worker can have, where the driver can tell: on a local master (``local``, ``local-cluster``),
the machine's available memory shared by every worker; with ``spark.executor.pyspark.memory``, that
share of each executor; on YARN and Kubernetes, whose containers hold the executor's memory overhead
besides its heap, that overhead (``spark.executor.memoryOverhead``) plus the PySpark memory. Elsewhere
(a standalone cluster) the training process checks on its host before its first step, once it knows
how many workers share the host. ``spark.tfbarrier.memoryCheck=false`` turns both checks off.
"""

import dataclasses
import re

from .communication import inner_optimizer
from .errors import ModelError
from .settings import MEMORY_CHECK_CONF, switched_on

TENSORFLOW_BYTES = 650 * 2**20  # a training process with TensorFlow, tf_keras and a strategy, before any model
DEFAULT_SLOTS = 2  # an optimizer this module does not know: assume Adam's
WORKING_COPIES = 7  # TensorFlow's working memory in a training process, in trainable weights (see above)
MIB = 2**20


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
    import numpy as np

    return sum(int(np.prod([int(d) for d in v.shape], dtype=np.int64)) * np.dtype(getattr(v.dtype, "name", v.dtype)).itemsize
               for v in variables)


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """A model's bytes as a training process holds them."""

    weights: int  # every variable
    trainable: int  # the trainable ones: each has a gradient and the optimizer's slots
    slots: int  # the optimizer's copies of each trainable weight
    optimizer: str

    @classmethod
    def of(cls, model):
        optimizer = getattr(model, "optimizer", None)
        return cls(weights=_bytes(model.weights), trainable=_bytes(model.trainable_weights),
                   slots=optimizer_slots(optimizer), optimizer=type(optimizer).__name__)

    def parts(self, batch_bytes):
        """What a training process holds, by part, in bytes."""
        return {"TensorFlow": TENSORFLOW_BYTES, "weights": self.weights,
                f"{self.optimizer}'s slots ({self.slots} per weight)": self.slots * self.trainable,
                "gradients": self.trainable, "TensorFlow's working memory": WORKING_COPIES * self.trainable,
                "a batch": batch_bytes}

    def worker_bytes(self, batch_bytes):
        return sum(self.parts(batch_bytes).values())

    def describe(self, batch_bytes):
        parts = ", ".join(f"{name} {_gb(value)}" for name, value in self.parts(batch_bytes).items() if value)
        return f"{_gb(self.worker_bytes(batch_bytes))} ({parts})"


def _gb(value):
    if value >= 2**30:
        return f"{value / 2**30:.2f} GB"
    return f"{value / MIB:.0f} MB" if value >= MIB else f"{value / 1024:.0f} KB"


def parse_size(text, default_unit="m"):
    """Bytes of a Spark memory setting ("4g", "512m", "1024": mebibytes unless it says)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)i?b?\s*", str(text).lower())
    if not match:
        raise ValueError(f"not a memory size: {text!r}")
    unit = match.group(2) or default_unit
    return int(float(match.group(1)) * 1024 ** " kmgtp".index(unit))


def batch_bytes(global_batch, num_workers, input_shape):
    """Bytes of one worker's batch of float32 inputs."""
    import math

    return global_batch // max(1, num_workers) * math.prod(d or 1 for d in input_shape or ()) * 4


def available_bytes():
    """This host's available memory (MemAvailable on Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def enabled(conf_get):
    return switched_on(conf_get, MEMORY_CHECK_CONF)


def executor_budget(spark, num_workers):
    """(bytes each worker can have, where that comes from, what to change) as far as the driver can
    tell, else None."""
    from . import cluster

    conf = spark.conf
    master = cluster.master(spark)
    pyspark_memory = conf.get("spark.executor.pyspark.memory", None)
    cores = int(conf.get("spark.executor.cores", "1") or 1)
    task_cpus = int(float(conf.get("spark.task.cpus", "1") or 1))
    tasks_per_executor = max(1, cores // max(1, task_cpus))
    if master.startswith(("yarn", "k8s://")):
        heap = parse_size(conf.get("spark.executor.memory", "1g"))
        factor = float(conf.get("spark.executor.memoryOverheadFactor", "0.1"))
        overhead = conf.get("spark.executor.memoryOverhead", None)
        budget = parse_size(overhead) if overhead else max(384 * MIB, int(factor * heap))
        budget += parse_size(pyspark_memory) if pyspark_memory else 0
        return (budget // tasks_per_executor,
                f"each executor's container holds {_gb(budget)} besides the JVM heap (memory overhead"
                f"{' and PySpark memory' if pyspark_memory else ''}) for {tasks_per_executor} task(s)",
                "raise spark.executor.memoryOverhead (training processes live outside the JVM's heap)")
    if pyspark_memory:
        budget = parse_size(pyspark_memory)
        return (budget // tasks_per_executor,
                f"spark.executor.pyspark.memory is {pyspark_memory} for {tasks_per_executor} task(s) per executor",
                "raise spark.executor.pyspark.memory")
    if cluster.on_this_machine(master):
        available = available_bytes()
        if available is None:
            return None
        return (available // num_workers,
                f"this machine has {_gb(available)} available for {num_workers} workers",
                "use fewer workers (num_workers), a smaller model or batch, or a machine with more memory")
    return None


def check_on_driver(spark, size, batch_bytes, num_workers):
    """Refuse, before the stage, a model whose workers cannot fit where the driver can tell."""
    if size is None or not enabled(spark.conf.get):
        return
    budget = executor_budget(spark, num_workers)
    if budget is None:
        return
    can_have, why, fix = budget
    _refuse_over(size, batch_bytes, can_have, why, fix)


def check_on_host(size, batch_bytes, workers_on_host, already_held):
    """In a training process with its model built: refuse to start training when the rest of what it
    needs (what it does not hold yet, ``already_held`` bytes past TensorFlow being there) is more than
    its share of the host's available memory."""
    available = available_bytes()
    if available is None:
        return
    share = available // max(1, workers_on_host) + already_held
    _refuse_over(size, batch_bytes, share + TENSORFLOW_BYTES,
                 f"this host has {_gb(available)} available for the {workers_on_host} worker(s) on it",
                 "use fewer workers per host, a smaller model or batch, or hosts with more memory")


def _refuse_over(size, batch_bytes, can_have, why, fix):
    need = size.worker_bytes(batch_bytes)
    if need > can_have:
        raise ModelError(
            f"each training process needs about {size.describe(batch_bytes)}, but can have about {_gb(can_have)}: "
            f"{why}. To fit: {fix}; or set {MEMORY_CHECK_CONF}=false to try anyway"
        )
