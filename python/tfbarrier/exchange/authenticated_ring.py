"""The "tfbarrier" exchange: tfbarrier's own ring (ring.py), which admits only processes that prove they hold
the job's secret, over TLS where the cluster encrypts. No TensorFlow server: a training process listens on
its port only until its ring is made. One copy of the model per worker, on one device. The default of every
fit of at most one GPU per worker. Its training process's side is ring_side.py."""

from tfbarrier.exchange.base import Exchange


class AuthenticatedRing(Exchange):
    name = "tfbarrier"
    # the weights and their gradients (each pack is summed where it lies: no copy of it), and copies of the largest
    # variable's gradient as the exchange and the optimizer's update compute with it, from the peaks of 2-worker
    # fits over the ring (bench/memory_estimate_bench.py: MLPs of 12 to 300 M parameters, mostly one matrix; 65 M
    # parameters in 16 layers of 16 MB, at 2.0 copies of the weights); 2.4 copies of the largest while a weight over
    # 16 MB was copied at every read (weights_file._assign), 4.9 copies of the weights before packs were summed in place
    step_copies = 2.0
    largest_copies = 1.4
    # the order its gradient packs leave in (ring_hooks.exchange_gradients): the last layers' first, which the backward
    # pass makes first, so a pack travels while it goes on; bench/pack_order.py's exchange sends the first layers' first
    last_layers_first = True
    options = ("bytes_per_pack", "compression", "timeout_seconds", "shard")

    def describe(self, communication):
        return {"implementation": "tfbarrier ring (authenticated)", "exchange": self.name, **communication}

    def join(self, job, config):
        from tfbarrier.exchange.ring_side import RingSide

        return RingSide(self, job, config)
