"""The "strategy" exchange (``StrategyExchange``): MultiWorkerMirroredStrategy's collectives, with fit's
``communication`` as the strategy takes it (``bytes_per_pack``, ``timeout_seconds``, ``implementation``,
``compression``: strategy_side.py says how each is applied). Its training process's side is strategy_side.py."""

from tfbarrier.exchange.base import Exchange

IMPLEMENTATIONS = ("auto", "ring", "nccl")  # the strategy's collectives (CommunicationImplementation)


class StrategyExchange(Exchange):
    """The "strategy" exchange: MultiWorkerMirroredStrategy's collectives, through TensorFlow's gRPC server
    (it accepts any client, and nothing encrypts it), with ``communication``'s CommunicationOptions. A worker
    may train on several GPUs (local replicas). Its training process's side is strategy_side.py."""

    name = "strategy"
    tensorflow_server = True
    local_replicas = True
    options = ("implementation", "bytes_per_pack", "timeout_seconds", "compression")
    # weights, gradients and gRPC's copies of each all-reduce, and as many copies again of the first
    # SMALL_MODEL_BYTES (TensorFlow's allocator keeps them): the peaks of 2-worker fits under the strategy
    # (bench/memory_estimate_bench.py at ec8e299)
    step_copies = 4.4
    small_model_copies = True

    def describe(self, communication):
        return {"exchange": self.name, **communication}

    def join(self, job, config):
        from tfbarrier.exchange.strategy_side import StrategySide

        return StrategySide(self, job, config)
