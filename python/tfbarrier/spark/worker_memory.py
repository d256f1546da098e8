"""What a training process can have in memory, as far as the driver or its host can tell: models/memory.py
compares it with what a process needs.

What a worker can have, where the driver can tell: on a local master (``local``, ``local-cluster``),
the machine's available memory shared by every worker, less a tenth of the machine (HEADROOM: the
kernel counts as available the page cache that running TensorFlow and the JVM read their code from,
and the estimate can be 5% under a peak; two workers of a 400 M model, each estimated within its share
of the rest, were ended by the OOM killer on a 24 GiB machine); with ``spark.executor.pyspark.memory``, that
share of each executor; on YARN and Kubernetes, whose containers hold the executor's memory overhead
besides its heap, that overhead (``spark.executor.memoryOverhead``) plus the PySpark memory. Elsewhere
(a standalone cluster) the training process checks on its host before its first step, once it knows
how many workers share the host. ``spark.tfbarrier.memoryCheck=false`` turns both checks off.
"""

import re

from tfbarrier.spark import cluster

MIB = 2**20
HEADROOM = 0.1  # of a host's memory, kept from the workers' share (see above)
HEADROOM_SAID = "(a tenth of its memory kept for the code that runs and the kernel)"


def gb(value):
    if value >= 2**30:
        return f"{value / 2**30:.2f} GB"
    return f"{value / MIB:.0f} MB" if value >= MIB else f"{value / 1024:.0f} KB"


def parse_size(text, default_unit="m"):
    """Bytes of a Spark memory setting ("4g", "512m", "1024": mebibytes unless it says)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)i?b?\s*", str(text).lower())
    if not match:
        raise ValueError(f"not a memory size: {text!r}")
    unit = match.group(2) or default_unit
    return int(float(match.group(1)) * 1024 ** " kmgtp".index(unit))


def _meminfo():
    """/proc/meminfo's fields in bytes ({} where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.rstrip().endswith("kB")}
    except OSError:
        return {}


def usable_bytes():
    """What the workers on this host may share: its available memory less HEADROOM of its memory, or
    None where it cannot be read."""
    info = _meminfo()
    if "MemAvailable" not in info or "MemTotal" not in info:
        return None
    return max(0, info["MemAvailable"] - int(HEADROOM * info["MemTotal"]))


def executor_budget(spark, num_workers):
    """(bytes each worker can have, where that comes from, what to change) as far as the driver can
    tell, else None."""
    conf = spark.conf
    master = cluster.master(spark)
    pyspark_memory = conf.get("spark.executor.pyspark.memory", None)
    cores = int(conf.get("spark.executor.cores", "1") or 1)
    task_cpus = int(float(conf.get("spark.task.cpus", "1") or 1))
    tasks_per_executor = max(1, cores // max(1, task_cpus))
    if master.startswith(("yarn", "k8s://")):
        heap = parse_size(conf.get("spark.executor.memory", "1g"))
        factor = float(conf.get("spark.executor.memoryOverheadFactor", "0.1"))
        overhead = conf.get("spark.executor.memoryOverhead", None)
        budget = parse_size(overhead) if overhead else max(384 * MIB, int(factor * heap))
        budget += parse_size(pyspark_memory) if pyspark_memory else 0
        return (budget // tasks_per_executor,
                f"each executor's container holds {gb(budget)} besides the JVM heap (memory overhead"
                f"{' and PySpark memory' if pyspark_memory else ''}) for {tasks_per_executor} task(s)",
                "raise spark.executor.memoryOverhead (training processes live outside the JVM's heap)")
    if pyspark_memory:
        budget = parse_size(pyspark_memory)
        return (budget // tasks_per_executor,
                f"spark.executor.pyspark.memory is {pyspark_memory} for {tasks_per_executor} task(s) per executor",
                "raise spark.executor.pyspark.memory")
    if cluster.on_this_machine(master):
        usable = usable_bytes()
        if usable is None:
            return None
        return (usable // num_workers,
                f"this machine has {gb(usable)} available for {num_workers} workers {HEADROOM_SAID}",
                "use fewer workers (num_workers), a smaller model or batch, or a machine with more memory")
    return None
