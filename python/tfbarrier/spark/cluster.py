"""What tfbarrier asks of the Spark cluster itself. Each SparkContext-only call sits behind one small
function here, with its Spark Connect path next to it (a Connect session has no SparkContext): the
rest of tfbarrier works the same in both modes."""

import os
import re
import shutil
import subprocess
import sys
import time
import warnings

from tfbarrier import faults
from tfbarrier.errors import ClusterError
from tfbarrier.settings import (DIRECT_PARQUET_CONF, DRIVER_LINK_CONF, ENCRYPTION_CONFS, EXECUTOR_PYTHON_PROBE_TIMEOUT,
                                FILE_POLL, SLOT_WAIT, SPARE_IDLE_CONF, SPARE_IDLE_TIMEOUT, SPARK_POLL, WARM_START_CONF,
                                switched_on)


def is_connect(spark):
    """True for a Spark Connect session (``SparkSession.builder.remote(...)``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _context(spark):
    return spark.sparkContext


def master(spark):
    return spark.conf.get("spark.master", "") if is_connect(spark) else _context(spark).master


def is_local_master(url):
    """True for ``local``/``local[N]`` master URLs: one JVM, every slot there from the start ("local-cluster"
    has executors of its own)."""
    return url == "local" or url.startswith("local[")


def on_this_machine(url):
    """True for master URLs whose executors all run on the driver's machine: ``local``, ``local[N]`` and
    ``local-cluster[...]`` (several executor JVMs, still one machine's memory)."""
    return is_local_master(url) or url.startswith("local-cluster[")


def is_local_mode(spark):
    """True for a session of a ``local``/``local[N]`` master (is_local_master)."""
    return is_local_master(master(spark))


def _estimated_slots(spark):
    """Connect: the slots the server's settings promise (no SparkContext to ask), or None."""
    url = master(spark)
    local = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", url)
    if local:
        threads = local.group(1)
        return 1 if threads is None else (os.cpu_count() if threads == "*" else int(threads))
    conf = spark.conf
    instances, cores = conf.get("spark.executor.instances", None), conf.get("spark.executor.cores", None)
    if instances and cores:
        return int(instances) * int(cores) // int(float(conf.get("spark.task.cpus", "1")))
    return None


def task_slots(spark):
    """How many tasks of the default resource profile the cluster runs at once right now (None when a
    Connect session cannot tell)."""
    if is_connect(spark):
        return _estimated_slots(spark)
    jsc = _context(spark)._jsc.sc()
    return jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile())


def spare_idle_timeout(spark):
    """How long the spare training process a task leaves waits for the next task (spares.py):
    spark.tfbarrier.spareIdleTimeout seconds (600), or 0 when spark.tfbarrier.warmStart is false."""
    if not switched_on(spark.conf.get, WARM_START_CONF):
        return 0.0
    value = spark.conf.get(SPARE_IDLE_CONF, None)
    try:
        seconds = SPARE_IDLE_TIMEOUT if value is None else float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ClusterError(f"{SPARE_IDLE_CONF} must be a number of seconds above 0, got {value!r}; "
                           f"to turn spares off, set {WARM_START_CONF}=false")
    return seconds


def direct_parquet(spark):
    """spark.tfbarrier.directParquet (default true): whether tasks read a plain Parquet scan themselves
    (parquet_source.py)."""
    return switched_on(spark.conf.get, DIRECT_PARQUET_CONF)


def driver_link_enabled(spark):
    """spark.tfbarrier.driverLink (default true): whether jobs open a link on the driver (driver_link.py)."""
    return switched_on(spark.conf.get, DRIVER_LINK_CONF)


def driver_host(spark):
    """The address executors reach the driver at."""
    return spark.conf.get("spark.driver.host", "127.0.0.1")


def num_partitions(df):
    """The DataFrame's partition count; None under Connect (no RDD to ask: callers repartition)."""
    return None if is_connect(df.sparkSession) else df.rdd.getNumPartitions()


def partition_keys(spark, num_partitions):
    """For each partition p < ``num_partitions``, an int key that ``repartition(num_partitions, key)``
    sends to partition p. Spark's hash partitioning puts a row in pmod(hash(key), n) (Murmur3, as
    ``F.hash``), so small ints collide; this asks Spark itself for one key per partition."""
    from pyspark.sql import functions as F

    candidates = spark.range(0, 64 * num_partitions).select(
        F.col("id").cast("int").alias("key"), F.pmod(F.hash(F.col("id").cast("int")), F.lit(num_partitions)).alias("p"))
    found = {row["p"]: row["key"] for row in candidates.groupBy("p").agg(F.min("key").alias("key")).collect()}
    missing = set(range(num_partitions)) - set(found)
    if missing:  # 64 tries per partition: a partition hit by none would be a broken hash
        raise RuntimeError(f"no partition key found for partition(s) {sorted(missing)}")
    return [found[p] for p in range(num_partitions)]


def with_partition_key(df, name, keys, keep):
    """``df`` with column ``name`` holding one of ``keys`` (from partition_keys): the key of the row's
    own partition's index (mod len(keys)) when ``keep``; else the rows of partition p go round-robin
    from target p on (row i to p + i), so that every target gets an even share of a large partition,
    and duplicates of a row are spread too. Deterministic: the same rows go to the same targets on a retry."""
    from pyspark.sql import functions as F

    if keep:
        target = F.spark_partition_id()
    else:  # monotonically_increasing_id: the partition's index in the upper 31 bits, the row's in the lower 33
        target = F.spark_partition_id() + F.monotonically_increasing_id().bitwiseAND(F.lit(2**33 - 1))
    index = F.pmod(target, F.lit(len(keys))).cast("int") + 1
    return df.withColumn(name, F.element_at(F.array(*map(F.lit, keys)), index))


def driver_resources(spark):
    """The driver's resources (GPUs in local mode), by name."""
    if is_connect(spark):
        return spark._client._resources()  # what pyspark's TorchDistributor uses under Connect
    return _context(spark).resources


EXECUTOR_MODULES = ("pyarrow", "pandas", "tfbarrier")  # what Spark's Python workers import for tfbarrier
_checked_pythons = set()  # executor interpreters found to have them, in this driver


def _executor_python(spark):
    """The interpreter Spark's Python workers run (classic sessions): spark.pyspark.python, else what
    the SparkContext took from PYSPARK_PYTHON when it started ("python3" from PATH if unset)."""
    return spark.conf.get("spark.pyspark.python", None) or _context(spark).pythonExec


def check_executor_python(spark):
    """Local mode: refuse at once when the executors' Python lacks what tfbarrier's tasks import (a
    script run as .venv/bin/python with the venv not activated starts workers with a bare python3)."""
    if is_connect(spark) or not is_local_mode(spark):
        return  # other machines: a task's ModuleNotFoundError is translated instead (stage.py)
    python = _executor_python(spark)
    resolved = shutil.which(python) or python
    if os.path.realpath(resolved) == os.path.realpath(sys.executable) or resolved in _checked_pythons:
        return
    probe = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)"
    try:
        out = subprocess.run([resolved, "-c", probe, *EXECUTOR_MODULES], capture_output=True, text=True,
                             timeout=EXECUTOR_PYTHON_PROBE_TIMEOUT)
    except OSError as exc:
        raise ClusterError(f"Spark's Python workers run {python!r}, which cannot be started ({exc}): set "
                           f"PYSPARK_PYTHON={sys.executable} before the SparkSession starts") from None
    error = faults.missing_module(out.stderr, resolved)
    if error is not None:
        raise error
    if out.returncode == 0:
        _checked_pythons.add(resolved)


def fits_at_once(spark, workers_per_fit, fits, most=None):
    """How many of ``fits`` barrier jobs of ``workers_per_fit`` workers run at once: as many as the
    cluster's slots hold (at least one, at most ``most``); ``most`` or one under Spark Connect, which
    does not tell its slots. Refuses a cluster that cannot run one (check_barrier_capacity)."""
    slots = check_barrier_capacity(spark, workers_per_fit)
    room = (most or 1) if slots is None else min(max(1, slots // workers_per_fit), most or slots)
    return max(1, min(room, fits))


def check_barrier_capacity(spark, num_workers, wait=SLOT_WAIT):
    """Refuse, before any job is submitted, a barrier stage the cluster cannot run: Spark would
    otherwise wait for slots (minutes) or fail obscurely. Waits up to ``wait`` seconds for executors
    that are still registering."""
    if spark.conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        raise ClusterError(
            "Spark barrier stages cannot run with dynamic allocation (SPARK-24942): start the "
            "session with spark.dynamicAllocation.enabled=false and a fixed number of executors"
        )
    if is_local_mode(spark) or is_connect(spark):
        wait = 0.0
    deadline = time.monotonic() + wait
    slots = task_slots(spark)
    if slots is None:
        warnings.warn(
            f"Spark Connect does not tell how many task slots the cluster has: if it has fewer than "
            f"num_workers={num_workers}, Spark's own barrier check fails the job after a few minutes",
            stacklevel=3,
        )
        return None
    while slots < num_workers and time.monotonic() < deadline:
        time.sleep(SPARK_POLL)
        slots = task_slots(spark)
    if slots < num_workers:
        raise ClusterError(
            f"num_workers={num_workers} needs {num_workers} task slots at once, but the cluster has "
            f"{slots} (executor cores / spark.task.cpus): use num_workers <= {slots}, or give the cluster "
            "more executors or cores (for local mode: master='local[N]' with N >= num_workers)"
        )
    return slots


def add_archive(spark, path):
    """Ship an archive to every executor, unpacked there (SparkFiles.get(its file name))."""
    if is_connect(spark):
        raise ClusterError(
            "PythonEnv.from_archive() needs SparkContext.addArchive, which Spark Connect does not have: use "
            "PythonEnv(requirements=...) (built on the executors), or ship the archive yourself with "
            "spark.addArtifacts(path, archive=True) and point spark.sql.execution.pyspark.python at it"
        )
    _context(spark).addArchive(path)


class _Inline:
    """Connect's stand-in for a broadcast: the value travels inside the function that reads it."""

    def __init__(self, value):
        self.value = value


def broadcast(spark, value):
    """A Spark broadcast of ``value``; executors read it with ``.value``."""
    if is_connect(spark):
        return _Inline(value)
    return _context(spark).broadcast(value)


def encryption_enabled(spark):
    """The settings of ENCRYPTION_CONFS that are on: Spark encrypts its own traffic."""
    return [key for key in ENCRYPTION_CONFS if str(spark.conf.get(key, "false")).lower() == "true"]


def context_alive(spark):
    """False once the SparkContext was shut down or its JVM is gone (classic sessions; Connect: True)."""
    if is_connect(spark):
        return True
    try:
        jsc = _context(spark)._jsc
        return jsc is not None and not jsc.sc().isStopped()
    except Exception:  # noqa: BLE001 - Py4J cannot reach the JVM
        return False


def label_jobs(spark, group):
    """Put the jobs this thread submits from now on into ``group`` (interrupting them on cancel);
    under Connect, tag the operations."""
    if is_connect(spark):
        spark.addTag(group)
    else:
        _context(spark).setJobGroup(group, "tfbarrier", interruptOnCancel=True)


def cancel_jobs(spark, group):
    """Cancel ``group``'s jobs, interrupting their running tasks (whose training processes die with
    them). Classic Spark: the job group (interruptTag does not stop running barrier tasks there)."""
    if is_connect(spark):
        spark.interruptTag(group)
    else:
        _context(spark).cancelJobGroup(group)


def cancel_all_jobs(spark):
    """Cancel every running job of the session (what pyspark's own Ctrl-C handler does)."""
    if is_connect(spark):
        spark.interruptAll()
    else:
        _context(spark).cancelAllJobs()


def wait_until_tasks_end(spark, group, timeout, lost_hosts=()):
    """Wait (at most ``timeout`` s) until no task of ``group``'s jobs runs any more: a failed barrier
    stage fails at once on the driver while Spark still kills its other tasks, which take their
    training processes with them. Tasks on ``lost_hosts`` are not waited for: Spark counts them as
    running until it gives their executors up (spark.network.timeout), yet cannot reach them to stop
    them. Under Connect there is no status tracker: it returns at once."""
    if is_connect(spark) or not context_alive(spark):
        return True
    tracker = _context(spark).statusTracker()
    deadline = time.monotonic() + timeout
    while _active_tasks(tracker, group) > tasks_running_on(spark, lost_hosts):
        if time.monotonic() > deadline:
            return False
        time.sleep(FILE_POLL)
    return True


def _executor_infos(spark):
    """Spark's ExecutorInfos now (in local mode, the driver's); None under Connect or without a context."""
    if is_connect(spark) or not context_alive(spark):
        return None
    return _context(spark)._jsc.sc().statusTracker().getExecutorInfos()


def executor_hosts(spark):
    """The hosts Spark has executors on now (in local mode, the driver's); None under Connect."""
    infos = _executor_infos(spark)
    return None if infos is None else {info.host() for info in infos}


def tasks_running_on(spark, hosts):
    """The tasks (of any job) Spark counts as running on executors of ``hosts`` (0 under Connect)."""
    infos = _executor_infos(spark) if hosts else None
    if infos is None:
        return 0
    return sum(info.numRunningTasks() for info in infos if info.host() in hosts)


def _active_tasks(tracker, group):
    active = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job else ():
            stage = tracker.getStageInfo(stage_id)
            active += stage.numActiveTasks if stage else 0
    return active
