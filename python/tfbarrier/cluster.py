"""What tfbarrier asks of the Spark cluster itself. Each SparkContext-only call sits behind one small
function here, so that a Spark Connect path can replace it (see DESIGN.md)."""

import time

from .errors import ClusterError

SLOT_WAIT = 15.0  # seconds to wait for executors to register before giving up on free slots


def _context(spark):
    return spark.sparkContext


def task_slots(spark):
    """How many tasks of the default resource profile the cluster runs at once right now."""
    jsc = _context(spark)._jsc.sc()
    return jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile())


def num_partitions(df):
    return df.rdd.getNumPartitions()


def check_barrier_capacity(spark, num_workers, wait=SLOT_WAIT):
    """Refuse, before any job is submitted, a barrier stage the cluster cannot run: Spark would
    otherwise wait for slots (minutes) or fail obscurely. Waits up to ``wait`` seconds for executors
    that are still registering."""
    if spark.conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        raise ClusterError(
            "Spark barrier stages cannot run with dynamic allocation (SPARK-24942): start the "
            "session with spark.dynamicAllocation.enabled=false and a fixed number of executors"
        )
    if _context(spark).master.startswith("local"):
        wait = 0.0  # local mode has all its slots from the start
    deadline = time.monotonic() + wait
    slots = task_slots(spark)
    while slots < num_workers and time.monotonic() < deadline:
        time.sleep(0.5)
        slots = task_slots(spark)
    if slots < num_workers:
        raise ClusterError(
            f"num_workers={num_workers} needs {num_workers} task slots at once, but the cluster has "
            f"{slots} (executor cores / spark.task.cpus): use num_workers <= {slots}, or give the cluster "
            "more executors or cores (for local mode: master='local[N]' with N >= num_workers)"
        )
    return slots


def broadcast(spark, value):
    """A Spark broadcast of ``value``; executors read it with ``.value``."""
    return _context(spark).broadcast(value)
