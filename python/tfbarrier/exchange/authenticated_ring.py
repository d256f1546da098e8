"""The "tfbarrier" exchange: tfbarrier's own ring (ring.py), which admits only processes that prove they hold
the job's secret, over TLS where the cluster encrypts. No TensorFlow server: a training process listens on
its port only until its ring is made. One copy of the model per worker, on one device. The default of every
fit of at most one GPU per worker. Its training process's side is ring_side.py."""

from tfbarrier.exchange.base import Exchange


class AuthenticatedRing(Exchange):
    name = "tfbarrier"
    # weights, gradients and the optimizer's temporaries (each pack is summed where it lies: no copy of it), from
    # the peaks of 2-worker fits over the ring (bench/memory_estimate_bench.py --baseline-ref: MLPs of 12 to 300 M
    # parameters, CNNs; SGD, momentum, Adam): 4.9 before packs were summed in place
    step_copies = 4.0
    # the order its gradient packs leave in (ring_hooks.exchange_gradients): the last layers' first, which the backward
    # pass makes first, so a pack travels while it goes on; bench/pack_order.py's exchange sends the first layers' first
    last_layers_first = True
    options = ("bytes_per_pack", "compression", "timeout_seconds", "shard")

    def describe(self, communication):
        return {"implementation": "tfbarrier ring (authenticated)", "exchange": self.name, **communication}

    def join(self, job, config):
        from tfbarrier.exchange.ring_side import RingSide

        return RingSide(self, job, config)
