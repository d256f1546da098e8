"""Every timeout, poll period, limit and environment variable of tfbarrier, and its own Spark settings,
in one place.

Times are in seconds. A user bounds a job through the arguments of ``fit``, ``run`` and ``apply``
(``timeout``; ``stall_timeout`` for ``fit``); the rest are fixed limits that only a stuck cluster
reaches. Spark's own settings that tfbarrier reads (``spark.driver.host``, the GPU and allocation
settings) are read where they are checked, in cluster.py and gpus.py.
"""

# ---- Spark settings a user can set (spark.conf) --------------------------------------------------
WARM_START_CONF = "spark.tfbarrier.warmStart"  # false: no spare training processes (spares.py)
SPARE_IDLE_CONF = "spark.tfbarrier.spareIdleTimeout"  # seconds an unused spare waits before it exits
DIRECT_PARQUET_CONF = "spark.tfbarrier.directParquet"  # false: Parquet goes through Spark (parquet_source.py)
DRIVER_LINK_CONF = "spark.tfbarrier.driverLink"  # false: no link; models and results go through Spark (transfer.py)
MEMORY_CHECK_CONF = "spark.tfbarrier.memoryCheck"  # false: no refusal of models that cannot fit (memory.py)
KERAS3_TRAINING_CONF = "spark.tfbarrier.keras3Training"  # a Keras 3 model: "auto", "native", "translated" (native_model.py)
ENCRYPTION_CONFS = ("spark.ssl.enabled", "spark.network.crypto.enabled")  # on: tfbarrier's traffic is encrypted
ENCRYPT_CONF = "spark.tfbarrier.encrypt"  # "auto": TLS when Spark encrypts; "always": TLS anyway (tls.py)


def switched_on(conf_get, key):
    """A spark.tfbarrier.* switch (``conf_get``: a session's ``spark.conf.get``): on unless set to false."""
    return str(conf_get(key, "true")).strip().lower() != "false"

# ---- environment variables -----------------------------------------------------------------------
# Set in every training process. TF_USE_LEGACY_KERAS makes `tf.keras` tf_keras, which works with
# MultiWorkerMirroredStrategy (Keras 3 does not, see keras_compat). TensorFlow's C++ start-up banners
# are kept out of the logs unless the user set a level of their own. (TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1,
# which gives a large model's freed transients back where oneDNN's pool keeps them, cost 1.3 x the step
# time of bench/workloads.py's large CNN on 2 workers and 1.6 x the 61 M MLP's, bench/allocator_bench.py:
# measured, not set.)
TRAINING_ENV = {"TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}
# Set by a training process whose TensorFlow runs without oneDNN (a CPU without AVX-512's neural-network
# extensions, or TF_ENABLE_ONEDNN_OPTS=0), unless the user set it: TensorFlow's plain CPU allocator maps
# and unmaps a step's tensors each time, and the kernel zeroes every page again (a 2-worker step of the
# slides' CNN spent as much time in the kernel as in TensorFlow, bench/README.md "Speed without oneDNN").
# With oneDNN, its own pool keeps them.
CPU_POOL_ENV = "TF_CPU_ALLOCATOR_USE_BFC"
# HDF5_PLUGIN_PATH=disable: what TensorFlow's own Keras sets on import (no HDF5 plugins loaded from a default
# path, ZDI-CAN-25480), set in every training process unless the user chose a path.
TRAINING_ENV_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2", "HDF5_PLUGIN_PATH": "disable"}
TF_CONFIG_ENV = "TF_CONFIG"  # the TensorFlow cluster, set by the training process before the strategy
KERAS3_PRELOAD_ENV = "TFBARRIER_PRELOAD_KERAS3"  # "1": a training process imports Keras 3 with TensorFlow
GPUS_ENV = "CUDA_VISIBLE_DEVICES"  # the GPUs of one training process (gpus.py)
ATTEMPT_ENV = "TFBARRIER_ATTEMPT"  # set in every training process: 1, then 2... after resubmissions
MODEL_LOAD_LOG_ENV = "TFBARRIER_MODEL_LOAD_LOG"  # test hook: a file every predict() model load is logged to
WORKON_HOME_ENV = "WORKON_HOME"  # where built environments live by default (environment.py)
# Not inherited by a training process from its Spark Python worker: the task sets its own.
TASK_ENV = (TF_CONFIG_ENV, GPUS_ENV, ATTEMPT_ENV)
# What importing TensorFlow and Keras 3 (and through it scikit-learn's joblib: KMP_*) writes into its own
# process's environment: a Python worker that ran predict() has them, one that only ran fit() has not. Left out
# of the training environment when they hold these values (None: any; TensorFlow's version, which nobody sets),
# so a keeper serves both: the training process's own imports set them again (HDF5_PLUGIN_PATH:
# TRAINING_ENV_DEFAULTS does; KMP_*, which matter only to Intel's OpenMP, where it imports Keras 3), and a user's
# own KMP_* of those values is left out with them.
IMPORT_SET_ENV = {"TF2_BEHAVIOR": "1", "ENABLE_RUNTIME_UPTIME_TELEMETRY": "1", "TPU_ML_PLATFORM": "Tensorflow",
                  "TPU_ML_PLATFORM_VERSION": None, "HDF5_PLUGIN_PATH": "disable", "KMP_DUPLICATE_LIB_OK": "True",
                  "KMP_INIT_AT_FORK": "FALSE"}

# ---- timeouts, seconds ---------------------------------------------------------------------------
STALL_TIMEOUT = 300.0  # fit()'s default: a training process silent this long past its first step is declared stuck
# From CONFIG to a training process's first step (strategy, model build, the first trace and collective):
# stall_timeout counts only from there, as set-up sends nothing; a large model's set-up takes minutes.
SETUP_TIMEOUT = 900.0
STARTUP_TIMEOUT = 300  # for a training process to import TensorFlow and report its port
SPARE_IDLE_TIMEOUT = 600.0  # spark.tfbarrier.spareIdleTimeout's default
SPARE_HANDOVER = 120.0  # for a keeper to hand a process to the task that connected (it may still import TensorFlow)
EXIT_GRACE = 30  # for a finished training process to exit before it is killed
STOP_GRACE = 5.0  # for a stopped training process to exit after SIGTERM, before SIGKILL
CANCEL_GRACE = 60  # for an interrupted Spark job's tasks to wind down
EXECUTOR_PYTHON_PROBE_TIMEOUT = 60  # local mode: for the executors' Python to import what tasks need
SLOT_WAIT = 15.0  # for executors to register before the slot check gives up
CONNECT_TIMEOUT = 5.0  # for a task to connect to the driver's link
TRANSFER_IDLE_TIMEOUT = 120.0  # a file streaming over the driver link with no byte for this long has failed
LOG_DRAIN = 2.0  # for a closing task to send its training process's last log lines to the driver
RENDEZVOUS_WAIT = 30.0  # from a rendezvous' first arrival until every task falls back to Spark's allGather
REQUEST_ANSWER_TIMEOUT = RENDEZVOUS_WAIT + 30.0  # a driver link request's answer (the rendezvous') comes by then
BUILD_TIMEOUT = 1800  # for one pip run, and for waiting on another task's environment build
PEER_PROBE_TIMEOUT = 2.0  # for a peer's host to answer a worker whose collective aborted, before it counts as lost
CAUSE_FIRST_WAIT = 5.0  # a task whose worker lost a live peer fails this much later: the peer's task reports the cause
REPLACEMENT_WAIT = 60.0  # before a retry after a lost worker, for the cluster to have num_workers free slots again

# ---- how often a wait looks again, seconds -------------------------------------------------------
SPARK_POLL = 0.5  # Spark's state: its slots, its running tasks (each look is a JVM call)
FILE_POLL = 0.2  # a file another process writes (a log, a lock), the tasks of an interrupted job
CHANNEL_POLL = 0.5  # a training process's channel, between the watchdog's looks at its clocks
STACKS_POLL = 0.1  # a stalled process's output, until its stacks stop growing

# ---- limits --------------------------------------------------------------------------------------
PORT_CLASH_ATTEMPTS = 3  # attempts a job gets when a port is taken under it, outside max_retries
LOG_TAIL_LINES = 40  # lines of a failed training process's output its error carries
PIP_TAIL_LINES = 30  # lines of pip's output an EnvironmentBuildError carries
# checkpoint_every in seconds: at the end of this call into TensorFlow the workers agree on the steps
# between checkpoints that the seconds come to (checkpoints.py).
CHECKPOINT_DECIDE_AT_CALL = 10
