"""What every exchange answers (tfbarrier.exchange has the registered ones): ``Exchange`` on the driver and in
the job, ``WorkerSide`` in each training process, where the one training loop (fitting/training_loop.py) calls
its hooks."""

import contextlib
import dataclasses

from tfbarrier.errors import InvalidArgumentError

COMPRESSIONS = ("none", "fp16")  # communication's compression, every exchange's
SHARDS = ("none", "optimizer")  # communication's shard: what each worker holds a 1/N of (the ring's: sharded_update.py)
PACK_BYTES = 16 * 2**20  # the gradients travel in packs of about this much each (bytes_per_pack's default)
# Gradients the backward pass of a sharded step may make ahead of the exchange that sums them, in packs. Unheld, it
# makes them all before the ring has summed a few (it computes a pack faster than the ring sums it), so a step held
# them all at once; held, a worker holds its own summed shares and this many packs: ZeRO's stage 2
# (sharded_update.held_back; bench/README.md).
PACKS_AHEAD = 2
TAKEN_CLIPNORM = "_tfbarrier_global_clipnorm"  # an optimizer's global_clipnorm that a sharded step took over


def applies_once(optimizer):
    """Whether a sharded step applies ``optimizer`` once, after every pack, not pack by pack: clipping by the global
    norm, or a moving average of the weights (EMA), needs every piece's gradient first (sharded_update.py). A worker
    then holds its whole share of the step's summed gradients, not one pack's (models/memory.py)."""
    return bool(getattr(optimizer, "global_clipnorm", None) or getattr(optimizer, TAKEN_CLIPNORM, None)
                or getattr(optimizer, "use_ema", False))


@dataclasses.dataclass(frozen=True)
class Exchange:
    """What every exchange answers. An exchange is plain data: it travels inside the job."""

    name = None  # what fit's ``exchange=`` calls it
    tensorflow_server = False  # its workers talk through TensorFlow's gRPC server, which TLS cannot cover
    local_replicas = False  # a worker may train on several GPUs at once (the strategy's local replicas)
    # A training process's peak in a step (models/memory.py), in copies of the trainable weights, and of the largest
    # trainable variable (or pack of gradients) besides; and whether TensorFlow's allocator keeps as many copies
    # again of the first memory.SMALL_MODEL_BYTES of the weights.
    step_copies = 0.0
    largest_copies = 0.0
    small_model_copies = False

    options = ("bytes_per_pack", "compression", "timeout_seconds")  # the communication= keys it takes

    def describe(self, communication):
        """What a worker's FitResult reports of how its gradients travelled (its ``communication``)."""
        raise NotImplementedError

    def check_options(self, communication):
        """Refuse ``communication`` options this exchange does not take (checked on the driver)."""
        for option in communication or {}:
            if option not in self.options:
                raise InvalidArgumentError(
                    f"communication={{'{option}': ...}} is not an option of exchange='{self.name}', which takes "
                    f"{list(self.options)}: drop it" + (", or pass exchange='strategy'" if option == "implementation"
                                                        else ""))

    def check_gpus(self, gpus_per_worker):
        if gpus_per_worker > 1 and not self.local_replicas:
            raise InvalidArgumentError(
                f"each worker has {gpus_per_worker} GPUs, but exchange='{self.name}' trains one copy of the model "
                "per worker, on one device: set spark.task.resource.gpu.amount=1 (one worker per GPU), or pass "
                "exchange='strategy' on a trusted network")

    def join(self, job, config):
        """This exchange in a training process, joined with the other workers of ``job`` (the task's
        ``config``): a WorkerSide. Imports TensorFlow: only training processes call it."""
        raise NotImplementedError


class WorkerSide:
    """An exchange in one training process: what the training loop (fitting/training_loop.py) asks of it, in
    the order it asks. The defaults are those of an exchange that does its work inside Keras's own calls."""

    size = 1  # how many workers train
    distribution = None  # the tf.distribute strategy the model is built in, or None
    # The workers' sums and gathers (``all_reduce_sum``, ``all_gather``, ``sum_variables``: ring.Ring's), which
    # the loop's validation, checkpoints and pacing use themselves; None where a strategy sums inside Keras.
    collective = None
    shards_optimizer = False  # each worker holds the optimizer's state of its own variables (optimizer_variables)

    def scope(self):
        """Where the model is built, made ready and paced (a strategy's scope)."""
        return contextlib.nullcontext()

    def optimizer_variables(self, model):
        """The variables whose optimizer state (slots) this worker holds: every trainable one, unless the
        exchange shards it."""
        return model.trainable_variables

    def hook(self, model, flavor, job):
        """Make the built ``model`` (of the fitting.flavors ``flavor``) exchange its gradients and metrics."""

    def dataset(self, make):
        """The dataset this worker trains or validates on, from ``make(tf.distribute.InputContext)``."""
        raise NotImplementedError

    def callbacks(self, callbacks):
        """The fit's ``callbacks`` (validation first, then tfbarrier's and the user's) among the exchange's own."""
        return callbacks

    def failures(self):
        """Around each ``model.fit``: where a failure of the exchange becomes its own error."""
        return contextlib.nullcontext()

    def close(self):
        """The fit is over on this worker (its model not yet written)."""

    def communication(self, model):
        """What the worker's FitResult reports of how its gradients travelled (after ``close``)."""
        raise NotImplementedError
