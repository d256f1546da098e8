"""Jobs: what the driver asks every barrier task to do, as plain data pickled to each task and from
there to its training process.

``Job`` holds what every kind shares (GPUs, environment, timeouts, the driver link) and the seams a
kind fills in, so that a new kind is one class:

  in the task              ``write_input`` (the partition to the shard file), ``check_peers``
                           and ``agree_steps`` (after the rendezvous)
  in the training process  ``execute`` (TensorFlow imported, TF_CONFIG set): a results.ProcessReport
  back on the driver       ``attempt_fields`` (what an attempt records) and ``decode`` (the workers'
                           results and the files they sent: what the call returns)

The kinds: ``FitJob`` (fitting/job.py: a Keras fit over its exchange), ``RunJob`` and ``ApplyJob``
(functions/jobs.py: the user's function in every worker, or on each task's partition).
"""

import dataclasses
import secrets
import uuid

from tfbarrier import settings


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
    # what a training process proves to its peers before they exchange anything (exchange/ring_admission.py)
    secret: str = dataclasses.field(default_factory=lambda: secrets.token_hex(16), repr=False)
    tls: object = None  # tls.Credentials when the job's own traffic is encrypted (the cluster's is); None: plain

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
