"""Which CPUs a training process runs on.

Workers of one job on one host, left to the OS scheduler, keep moving between the same cores, and
every move stalls the collective the other workers wait at (bench/README.md, "Closing the gap to one
process"). So the tasks of a job that share a host and the same CPUs (their Python worker's affinity:
a container's cpuset, or the whole host) split those CPUs among them, contiguous and in task order,
and each pins its training process to its part. A task alone on its CPUs, one with GPUs (its input
pipeline feeds them from every core) and ``spark.tfbarrier.pinCpus=false`` leave the OS in charge.
"""

import os


def available():
    """The CPUs this process may run on, sorted; None where the OS cannot tell."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def share(peers, index):
    """Task ``index``'s part of the CPUs it shares with the other tasks on its host (``peers``: the
    rendezvous's list, each with ``host`` and ``cpus``); None when it shares them with no one."""
    me = peers[index]
    mates = [i for i, peer in enumerate(peers) if peer["host"] == me["host"] and peer.get("cpus") == me.get("cpus")]
    cpus = me.get("cpus")
    if len(mates) < 2 or not cpus or len(cpus) < len(mates):
        return None
    rank, size = mates.index(index), len(cpus) // len(mates)
    extra = len(cpus) % len(mates)  # the first ranks take one more
    start = rank * size + min(rank, extra)
    return cpus[start:start + size + (rank < extra)]


def pin(cpus):
    """Pin every thread of this process (the ones TensorFlow starts later inherit it) to ``cpus``."""
    for thread in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread), cpus)
        except OSError:  # a thread that just ended
            pass
