"""The description of one fit()/run() job: plain data made on the driver and pickled to every task
and from there to every training process."""

import dataclasses
import os
import sys
import sysconfig
import uuid

import cloudpickle

# Environment of every training process. TF_USE_LEGACY_KERAS makes `tf.keras` tf_keras, which works
# with MultiWorkerMirroredStrategy (Keras 3 does not, see keras_compat). TensorFlow's C++ start-up
# banners are kept out of the logs unless the user set a level of their own.
TRAINING_ENV = {"TF_USE_LEGACY_KERAS": "1"}
TRAINING_ENV_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2"}
ATTEMPT_ENV = "TFBARRIER_ATTEMPT"  # set in every training process: 1, then 2... after resubmissions


@dataclasses.dataclass
class JobSpec:
    kind: str  # "fit", "run" or "apply"
    num_workers: int
    # fit
    model: object = None  # ModelSpec
    layout: object = None  # shards.Layout
    source: list = None  # per worker, the parquet_source.Slices its task reads; None: its partition
    epochs: int = 1
    batch_size: int = 32  # global batch size, split evenly across workers
    steps_per_epoch: int = None  # None: one pass over all rows per epoch
    seed: int = None
    shuffle: bool = True
    shuffle_buffer: int = None  # rows; None: shards.SHUFFLE_BUFFER_ROWS, at most SHUFFLE_BUFFER_BYTES of them
    callbacks: bytes = None  # cloudpickled function returning a list of tf.keras callbacks
    checkpoint_dir: str = None  # BackupAndRestore state and the epoch log, shared by every worker
    tensorboard_dir: str = None  # the chief's TensorBoard logs
    # run, apply
    function: bytes = None  # cloudpickled (fn, args, kwargs) for run, fn for apply
    # apply
    input_schema: object = None  # pyarrow schema of the partitions
    output_schema: object = None  # pyarrow schema the function's frames are cast to (None: as they come)
    # all
    gpus: object = "hide"  # gpus.HIDE, gpus.TASK, or one list of GPU addresses per worker (local mode)
    tf_threads: int = None  # intra-op threads per training process; None: the task's CPUs
    env: object = None  # environment.PythonEnv of the training process; None: the executor's own Python
    warm_start: bool = True  # take a Python worker's spare training process, leave one after success
    stall_timeout: float = None  # seconds without any message from a training process before it is declared stuck
    attempt: int = 1  # 1 + the number of times the driver resubmitted the job
    progress: dict = None  # the driver's progress server: host, port, token (None: no live progress)
    verbose: int = 0
    started_at: float = None  # driver clock at fit()/run() start, for time-to-first-step
    job_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])


def _installed(module):
    """True for modules of the standard library or of an installed distribution (importable on any
    executor that has the same environment); False for the user's own scripts and notebooks."""
    path = getattr(module, "__file__", None)
    if path is None:
        return module.__name__ in sys.builtin_module_names
    path = os.path.realpath(path)
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(path.startswith(os.path.realpath(root) + os.sep) for root in roots)


def pickle_user_code(obj, function):
    """cloudpickle ``obj``, shipping ``function``'s module by value when it is the user's own code (a
    script, a test module, a notebook helper), which the training processes could not import."""
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    by_value = module is not None and module.__name__ != "__main__" and not _installed(module)
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(obj)
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)
