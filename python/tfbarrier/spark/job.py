"""Jobs: what the driver asks every barrier task to do, as plain data pickled to each task and from
there to its training process.

``Job`` holds what every kind shares (GPUs, environment, timeouts, the driver link) and the seams a
kind fills in, so that a new kind is one class:

  in the task              ``write_input`` (the partition to the shard file), ``check_peers``
                           and ``agree_steps`` (after the rendezvous)
  in the training process  ``execute`` (TensorFlow imported, TF_CONFIG set): a results.ProcessReport
  back on the driver       ``attempt_fields`` (what an attempt records) and ``decode`` (the workers'
                           results and the files they sent: what the call returns)

The kinds: ``FitJob`` (fit_job.py: Keras fit under MultiWorkerMirroredStrategy), and here ``RunJob``
(call the user's function in every worker) and ``ApplyJob`` (call it on each task's partition).
"""

import dataclasses
import json
import os
import secrets
import sys
import sysconfig
import time
import uuid

import cloudpickle

from tfbarrier import settings
from tfbarrier.data import shards
from tfbarrier.errors import ColumnError
from tfbarrier.faults import port_clash_is_retryable
from tfbarrier.results import ProcessReport


@dataclasses.dataclass
class Job:
    """The settings every kind of job shares."""

    needs_tensorflow = True  # False: the job runs without TensorFlow when its environment has none
    tensorflow_server = True  # False: the training process listens on its port itself (CONFIG's "listener")
    imports_keras3 = False  # True: the training process imports Keras 3 with TensorFlow (a spare for it too)

    gpus: object = "hide"  # gpus.HIDE, gpus.TASK, or one list of GPU addresses per worker (local mode)
    tf_threads: int = None  # intra-op threads per training process; None: the task's CPUs
    env: object = None  # environment.PythonEnv of the training process; None: the executor's own Python
    spare_idle_timeout: float = settings.SPARE_IDLE_TIMEOUT  # take a spare, leave one that waits this long; 0: none
    stall_timeout: float = None  # seconds without any message from a training process before it is declared stuck
    attempt: int = 1  # 1 + the number of times the driver resubmitted the job
    link: dict = None  # the driver's link (driver_link.py): host, port, token, pinned certificate; None: none
    verbose: int = 0
    started_at: float = None  # driver clock at the call, for deadlines and time-to-first-step
    job_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])
    # what a training process proves to its peers before they exchange anything (exchange.py)
    secret: str = dataclasses.field(default_factory=lambda: secrets.token_hex(16), repr=False)
    tls: object = None  # job_tls.Credentials when the job's own traffic is encrypted (the cluster's is); None: plain

    # ---- in the task (no TensorFlow there) ----
    def write_input(self, batches, path, index):
        """Write task ``index``'s partition (an iterator of Arrow record batches) to the shard file at
        ``path`` (other input files go next to it); return what was written: ``rows``, ``checksum`` of
        the rows or None, and what else the kind counts (``validation_rows``...). Every ``*rows`` count
        reaches the peers."""
        return {"rows": 0, "checksum": None}

    def check_peers(self, peers):
        """Refuse what the gathered peers (host, port, rows each) cannot train on."""

    def agree_steps(self, peers):
        """What every worker must agree on from the peers' row counts, as fields of the CONFIG message
        (``steps_per_epoch``...): nothing for kinds without epochs."""
        return {}

    # ---- in the training process ----
    def execute(self, tf, config, channel):
        """Do the work with ``config`` (the protocol's CONFIG message: tf_config, the work directory
        holding the job's payloads and the shard, the worker's row counts, how many workers share its
        host and what ``agree_steps`` agreed) and return a ProcessReport, whose ``files`` (written in
        the work directory) go to the driver; ``tf`` is None when TensorFlow is not installed.
        ``channel`` (a protocol.Channel) goes to the task, for PROGRESS messages."""
        raise NotImplementedError

    # ---- back on the driver ----
    def attempt_fields(self, results):
        """What the kind records of a successful attempt besides its bytes (``FitResult.attempts``)."""
        return {}

    def decode(self, results, files):
        """What the workers sent back, as the caller gets it: ``results`` are their WorkerResults in worker
        order, ``files`` the job's transfer.JobFiles (``files.received(payload)``: a sent file's path)."""
        raise NotImplementedError


def _report(started, **fields):
    return ProcessReport(timings={"training": time.time() - started}, python_prefix=sys.prefix,
                         finished_at=time.time(), **fields)


def load_payload(payload, workdir):
    """The cloudpickled value of ``payload`` (a transfer.Payload in ``workdir``)."""
    with open(payload.path(workdir), "rb") as f:
        return cloudpickle.load(f)


VALUE_FILE = "value.pkl"  # run: the chief's return value, cloudpickled
TABLE_FILE = "table.arrow"  # apply: the frame a worker returned, as an Arrow IPC stream


@dataclasses.dataclass
class RunJob(Job):
    """``run``: call the user's function in every training process; the chief's value comes back."""

    needs_tensorflow = False
    function: object = None  # transfer.Payload: cloudpickled (fn, args, kwargs)

    def execute(self, tf, config, channel):
        fn, args, kwargs = load_payload(self.function, config["workdir"])
        started = time.time()
        with port_clash_is_retryable():  # the user's function builds the strategy
            value = fn(*args, **kwargs)
        if config["tf_config"]["task"]["index"] != 0:
            return _report(started)
        with open(os.path.join(config["workdir"], VALUE_FILE), "wb") as f:
            cloudpickle.dump(value, f)
        return _report(started, files={"value": VALUE_FILE})

    def decode(self, results, files):
        """The chief's return value."""
        with open(files.received(results[0].files["value"]), "rb") as f:
            return cloudpickle.load(f)


@dataclasses.dataclass
class ApplyJob(Job):
    """``apply``: call the user's function on each task's partition; its frame comes back as an Arrow
    IPC stream, cast to ``output_schema`` when given."""

    needs_tensorflow = False
    function: object = None  # transfer.Payload: cloudpickled fn(partition, barrier)
    input_schema: object = None  # pyarrow schema of the partitions
    output_schema: object = None  # pyarrow schema the function's frames are cast to (None: as they come)

    def write_input(self, batches, path, index):
        return {"rows": shards.write_partition(batches, path), "checksum": None}

    def execute(self, tf, config, channel):
        import pyarrow as pa

        fn = load_payload(self.function, config["workdir"])
        tf_config = config["tf_config"]
        index = tf_config["task"]["index"]
        barrier = {"address": tf_config["cluster"]["worker"][index], "partition": index,
                   "num_workers": len(tf_config["cluster"]["worker"]), "tf_config": json.dumps(tf_config)}
        started = time.time()
        frame = fn(shards.read_partition(config["shard"], self.input_schema), barrier)
        table = self._cast(pa.Table.from_pandas(frame, preserve_index=False))
        with pa.ipc.new_stream(os.path.join(config["workdir"], TABLE_FILE), table.schema) as writer:
            writer.write_table(table)
        return _report(started, files={"table": TABLE_FILE})

    def decode(self, results, files):
        """The workers' frames, concatenated in worker order (a pandas DataFrame)."""
        import pyarrow as pa

        tables = [pa.ipc.open_stream(files.received(r.files["table"])).read_all() for r in results]
        return pa.concat_tables(tables, promote_options="default").to_pandas()

    def _cast(self, table):
        if self.output_schema is None:
            return table
        missing = [name for name in self.output_schema.names if name not in table.column_names]
        if missing:
            raise ColumnError(f"the function's result has no column(s) {missing}; it has {table.column_names}")
        return table.select(self.output_schema.names).cast(self.output_schema)


def _installed(module):
    """True for modules of the standard library or of an installed distribution (importable on any
    executor that has the same environment); False for the user's own scripts and notebooks."""
    path = getattr(module, "__file__", None)
    if path is None:
        return module.__name__ in sys.builtin_module_names
    path = os.path.realpath(path)
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(path.startswith(os.path.realpath(root) + os.sep) for root in roots)


def _registered_by_value(module):
    return module.__name__ in getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", ())


def pickle_user_code(obj, *functions):
    """cloudpickle ``obj``, shipping the modules of ``functions`` (functions or classes) by value when
    they are the user's own code (a script, a test module, a notebook helper), which the training
    processes could not import. The user's other modules that ``obj`` uses go by value once registered
    with cloudpickle's ``register_pickle_by_value`` (README); such a registration outlives the call."""
    modules = {sys.modules.get(getattr(function, "__module__", None) or "") for function in functions}
    by_value = [module for module in modules if module is not None and module.__name__ != "__main__"
                and not _installed(module) and not _registered_by_value(module)]
    for module in by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(obj)
    finally:
        for module in by_value:
            cloudpickle.unregister_pickle_by_value(module)
