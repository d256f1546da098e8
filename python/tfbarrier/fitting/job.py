"""The ``fit`` kind of job: Keras ``model.fit`` on each task's shard, the gradients exchanged as its
``exchange`` (tfbarrier.exchange) says.

The job is plain data, made on the driver. In the task: the partition (or the task's slices of a plain
Parquet scan) is streamed to the shard file (and the validation rows to theirs), every worker must have
rows, and the peers agree on the steps. The training process's side, where TensorFlow is, is the training loop
(fitting/training_loop.py), with the exchange's hooks (its WorkerSide) and fitting/training.py's toolkit.
"""

import dataclasses
import os

import numpy as np
import pyarrow as pa

from tfbarrier import checks, settings
from tfbarrier.data import shards
from tfbarrier.errors import InvalidArgumentError
from tfbarrier.spark import protocol, rendezvous
from tfbarrier.spark.job import Job

VALIDATION_COLUMN = "__tfbarrier_validation"  # with validation_data: True for its rows in the stage's frame


def validates(has_validation_data, validation_split):
    """Whether a fit validates: it was given validation_data, or a validation_split above 0."""
    return bool(has_validation_data or validation_split)


def argument(default, check=None, tracked=True):
    """A FitJob field that is fit's argument of the same name, said once here: ``check(name, value)`` is what
    fit's driver makes of the argument (front.prepare takes every field that has one, in words where it is
    wrong), ``tracked`` whether MLflow records it (tracking/fit.py). Without ``check``, prepare makes the field
    itself (from arguments that depend on each other)."""
    return dataclasses.field(default=default, metadata={"check": check, "tracked": tracked})


@dataclasses.dataclass
class FitJob(Job):
    """``fit``: what to train (the model, which columns), how (epochs, batch, shuffling, callbacks)
    and where its state goes (checkpoints, saved models, TensorBoard). A field made with ``argument`` is one of
    fit's arguments; a new one is that field, its line in api.fit's signature and documentation (a test holds the
    two together), and what it does."""

    model: object = None  # ModelSpec
    layout: object = None  # features.Features
    source: object = None  # a source the tasks read themselves (parquet_source.Source); None: their partitions
    # Job's, and fit's arguments: every kind has a watchdog and threads
    stall_timeout: float = argument(settings.STALL_TIMEOUT, checks.positive_seconds, tracked=False)
    tf_threads: int = argument(None)  # made by spark/preflight.job_basics
    epochs: int = argument(1, checks.positive_int)
    batch_size: int = argument(32, checks.positive_int)  # global batch size, split evenly across workers
    steps_per_epoch: int = argument(None, checks.optional_positive_int)  # None: one pass over all rows per epoch
    seed: int = argument(None, checks.optional_int)
    # shuffles each shard, the same on every attempt (fit draws one when seed is None); recorded, not an argument
    data_seed: int = dataclasses.field(default=None, metadata={"tracked": True})
    shuffle: bool = argument(True, checks.flag)
    # rows; None: shards.SHUFFLE_BUFFER_ROWS, at most SHUFFLE_BUFFER_BYTES of them
    shuffle_buffer: int = argument(None, checks.optional_positive_int)
    callbacks: object = None  # transfer.Payload: the cloudpickled function returning a list of tf.keras callbacks
    checkpoint_dir: str = argument(None)  # the training state (checkpoints.py) and the epoch log, shared by every worker
    checkpoint_every: tuple = argument(None)  # ("steps", n) or ("seconds", s): save within epochs too (checkpoints.py)
    tensorboard_dir: str = argument(None, checks.directory, tracked=False)  # the chief's TensorBoard logs
    has_validation_column: bool = False  # the partitions carry VALIDATION_COLUMN: validation_data's rows
    validation_split: float = argument(None)  # the fraction of each partition held out for validation
    validation_freq: int = argument(1)  # validate after every this many epochs
    class_weight: dict = argument(None, checks.class_weights)  # {class id: weight} for training
    save_to: str = argument(None, tracked=False)  # the chief saves the model there after each epoch (saving.py)
    save_best: str = argument(None)  # ... only when this metric improves
    save_mode: str = argument("min", tracked=False)  # ... "min" or "max"
    # steps per call into TensorFlow: "auto", n, or None (as compiled)
    steps_per_execution: object = argument("auto", checks.steps_per_execution)
    # the exchange's options: packs, compression, timeout (the strategy's implementation)
    communication: dict = argument(None)
    memory_check: bool = True  # refuse to train when the host cannot hold what the model needs (memory.py)
    exchange: object = None  # how gradients travel (tfbarrier.exchange.Exchange), chosen once on the driver

    @property
    def validates(self):
        return validates(self.has_validation_column, self.validation_split)

    # ---- in the task ----
    def write_input(self, batches, path, index):
        if self.source is not None:  # read here rather than through Spark
            batches = self.source.batches(index, self.layout.columns)
        held_out = self._held_out(index)
        if held_out is None:
            rows, checksum = shards.write(batches, path, self.layout)
            return {"rows": rows, "checksum": checksum}
        validation = (os.path.join(os.path.dirname(path), protocol.VALIDATION_FILE), held_out)
        (rows, checksum), (held, held_checksum) = shards.write(batches, path, self.layout, validation)
        return {"rows": rows, "checksum": checksum, "validation_rows": held, "validation_checksum": held_checksum}

    def _held_out(self, index):
        """The function marking the validation rows of each Spark batch, or None without validation.
        validation_split draws them from a generator seeded by (seed, worker): a partition that comes
        in the same order holds out the same rows on every attempt."""
        if self.has_validation_column:
            return lambda batch: batch.column(VALIDATION_COLUMN)
        if self.validation_split:
            draws = np.random.default_rng([self.seed or 0, index])
            return lambda batch: pa.array(draws.random(len(batch)) < self.validation_split)
        return None

    def check_peers(self, peers):
        if self.validates and not sum(peer["validation_rows"] for peer in peers):
            raise InvalidArgumentError(
                f"validation_split={self.validation_split} held out no row of {sum(p['rows'] for p in peers)}: "
                "raise it, or pass validation_data="
            )
        empty = [i for i, peer in enumerate(peers) if peer["rows"] == 0]
        if empty:
            raise InvalidArgumentError(
                f"partition(s) {empty} of the training data are empty, so those workers have nothing to train "
                "on, although the driver's check found rows for every worker: the data changed in between "
                "(a non-deterministic DataFrame, e.g. sample() without a seed?); cache() it first"
            )

    def agree_steps(self, peers):
        agreed = {"steps_per_epoch": self.steps_per_epoch
                  or rendezvous.steps_per_epoch([p["rows"] for p in peers], self.batch_size)}
        if self.validates:
            agreed["validation_steps"] = rendezvous.validation_steps([p["validation_rows"] for p in peers],
                                                                     self.batch_size)
        return agreed

    # ---- back on the driver ----
    def attempt_fields(self, results):
        """Where the attempt started: initial_epoch (> 0 when it resumed) and resumed_at."""
        chief = results[0].output
        return {"initial_epoch": chief.initial_epoch, "resumed_at": chief.resumed_at}

    def decode(self, results, files):
        """The path of the chief's trained model: its weights, or a model function's .keras archive."""
        chief = results[0]
        return files.received(chief.files.get("weights") or chief.files.get("adapters") or chief.files["archive"])

    # ---- in the training process ----
    @property
    def tensorflow_server(self):
        return self.exchange.tensorflow_server

    @property
    def imports_keras3(self):  # a model function's too: it may build a Keras 3 model (over the ring)
        return getattr(self.model, "native", False) or (self.model.flavor == "function" and not self.tensorflow_server)

    def execute(self, tf, config, channel):
        from tfbarrier.fitting import training_loop  # imports TensorFlow: only training processes call it

        return training_loop.train(self, config, channel)
