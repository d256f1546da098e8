"""What every exchange answers (tfbarrier.exchange has the registered ones)."""

import dataclasses
import importlib

from tfbarrier.errors import InvalidArgumentError

COMPRESSIONS = ("none", "fp16")  # communication's compression, every exchange's
PACK_BYTES = 16 * 2**20  # the gradients travel in packs of about this much each (bytes_per_pack's default)


@dataclasses.dataclass(frozen=True)
class Exchange:
    """What every exchange answers. An exchange is plain data: it travels inside the job."""

    name = None  # what fit's ``exchange=`` calls it
    tensorflow_server = False  # its workers talk through TensorFlow's gRPC server, which TLS cannot cover
    local_replicas = False  # a worker may train on several GPUs at once (the strategy's local replicas)
    trainer = None  # the module of its training process's side, whose train(job, config, channel) runs the fit
    # A training process's peak in a step, in copies of the trainable weights (models/memory.py); and whether
    # TensorFlow's allocator keeps as many copies again of the first memory.SMALL_MODEL_BYTES of them.
    step_copies = 0.0
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

    def train(self, job, config, channel):
        """The training process's side of the fit (imports TensorFlow: only training processes call it)."""
        return importlib.import_module(self.trainer).train(job, config, channel)
