"""The "tfbarrier" exchange in a training process (``RingSide``): the worker's place in the ring of the job's
training processes (ring.Ring, which admits only processes holding the job's secret), and what it hooks into
Keras (ring_hooks.py):

- each step's gradients, summed and divided by the workers inside the compiled step, before the
  outermost optimizer applies them (Keras 3's ``optimizer.apply``, tf_keras's ``apply_gradients``), so
  every worker takes one process's step on the global batch and every weight and slot stays equal;
- each epoch's metric states (every Keras metric variable aggregates by sum), summed before Keras
  reads the epoch's results, so the history is the global batch's, as one process would log it;
- the callbacks that keep the workers one model (a call's logs made global, the moving statistics averaged,
  a stop agreed).

With ``communication={"shard": "optimizer"}``, each worker holds the optimizer's state of its own variables
only, and a step reduce-scatters the gradients and all-gathers the updated weights (sharded_update.py).

No distribution strategy and no TensorFlow server: each worker trains its own copy of the model on its shard,
in the model's Keras. Imported only in training processes.
"""

import contextlib

import tensorflow as tf

from tfbarrier import settings
from tfbarrier.exchange.base import WorkerSide
from tfbarrier.exchange.ring import Ring
from tfbarrier.exchange.ring_hooks import (AverageState, ExchangedOnly, GlobalBatchLogs, StopTogether,
                                           exchange_gradients, sum_metrics)
from tfbarrier.exchange.sharded_update import shard_updates
from tfbarrier.exchange.shards import Shards, SyncBlocks


class RingSide(WorkerSide):
    def __init__(self, exchange, job, config):
        index = config["tf_config"]["task"]["index"]
        try:  # made on the port this process listened on
            self.ring = Ring.join(index, config["tf_config"]["cluster"]["worker"], job.secret.encode(),
                                  config["listener"], timeout=(job.communication or {}).get("timeout_seconds")
                                  or job.stall_timeout or settings.STALL_TIMEOUT, tls=job.tls)
        finally:
            config["listener"].close()  # the ring is made: from here on this process listens on no port
        self.exchange, self.size, self.collective = exchange, self.ring.size, self.ring
        self.options = job.communication
        self.input_context = tf.distribute.InputContext(num_input_pipelines=self.size, input_pipeline_id=index,
                                                        num_replicas_in_sync=self.size)
        self.exchanged, self.sent = set(), None  # the variables whose gradients cross (ids), as the step is traced
        self.shards = None  # this worker's share of the optimizer's state, where each worker holds one (Shards)

    def optimizer_variables(self, model):
        if (self.options or {}).get("shard", "none") == "none":
            return model.trainable_variables
        self.shards = Shards(model.trainable_variables, self.ring.rank, self.size)
        return self.shards.updated

    @property
    def shards_optimizer(self):
        return self.shards is not None

    def hook(self, model, flavor, job):
        drawn = job.model.drawn_by_each_worker(model)
        if drawn:  # the chief's values to every worker (the strategy gives every variable worker 0's initial value)
            self.ring.broadcast_variables(drawn)
        model.jit_compile = False  # the exchange is a Python call, which XLA cannot compile
        if self.shards is None:
            self.sent = exchange_gradients(model.optimizer, self.ring, flavor, job.communication, self.exchanged,
                                           last_layers_first=self.exchange.last_layers_first)
        else:
            self.sent = shard_updates(model.optimizer, self.ring, flavor, self.shards, job.communication,
                                      self.exchanged, last_layers_first=self.exchange.last_layers_first)
            self.sent["state_of_weights"] = self.shards.weights_held()
        sum_metrics(model, self.ring, flavor.metrics_reader)

    def dataset(self, make):
        return make(self.input_context)

    def callbacks(self, callbacks):
        """First, a call's logs made global and the moving statistics (BatchNormalization's) averaged before
        validation (the first of ``callbacks``), whose val_* every later callback sees; then a stop agreed; last,
        where the optimizer's state is sharded, the blocks it updates made the model's again (a restore's)."""
        synced = [SyncBlocks(self.shards, self.ring)] if self.shards is not None else []
        return [GlobalBatchLogs(self.ring), ExchangedOnly(self.ring, self.exchanged), AverageState(self.ring),
                *callbacks, StopTogether(self.ring, callbacks), *synced]

    @contextlib.contextmanager
    def failures(self):
        """A peer lost in the ring, raised inside the compiled step, reaches the fit as TensorFlow's error of the
        step: the ring's own PeerLostError (``ring.failure``) is raised instead, a consequence the driver traces
        to its cause (faults.lost_contact)."""
        try:
            yield
        except Exception as exc:
            if self.ring.failure is None:
                raise
            raise self.ring.failure from exc

    def close(self):
        self.ring.close()

    def communication(self, model):
        return dict(self.exchange.describe(self.sent), bytes_sent=self.ring.bytes_sent)
