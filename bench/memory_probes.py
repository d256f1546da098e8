"""Memory probes the benchmarks share: the peak resident memory of processes, sampled by a thread of
its own (PeakSampler, of one process: process_mb, or of tfbarrier's training processes:
training_processes_mb), this process's resident memory (resident_mb) and the Spark driver JVM's heap
(jvm_heap)."""

import threading


class PeakSampler:
    """The peak resident memory (MB) of the processes ``select()`` measures (it returns their resident
    memory in MB), sampled every ``interval`` s by a thread of its own from start() (or entering) to
    stop() (or leaving); sampling ends early once ``select()`` raises (the process ended)."""

    def __init__(self, select, interval):
        self.peak_mb = 0.0
        self._select, self._interval = select, interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._done.is_set():
            try:
                self.peak_mb = max([self.peak_mb, *self._select()])
            except Exception:  # noqa: BLE001 - the process ended
                return
            self._done.wait(self._interval)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        """The peak, once the sampling thread has ended."""
        self._done.set()
        self._thread.join()
        return self.peak_mb

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def process_mb(pid):
    """For PeakSampler: a function measuring process ``pid`` (it raises once the process ended)."""
    import psutil

    process = psutil.Process(pid)
    return lambda: [process.memory_info().rss / 2**20]


def training_processes_mb():
    """For PeakSampler: the resident memory (MB) of every live tfbarrier training process (by its command line)."""
    import psutil

    return [proc.info["memory_info"].rss / 2**20 for proc in psutil.process_iter(["cmdline", "memory_info"])
            if "tfbarrier.spark.training_process" in " ".join(proc.info["cmdline"] or []) and proc.info["memory_info"]]


def resident_mb():
    """(resident, peak resident) memory of this process in MB."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def jvm_heap(spark):
    """(heap used, the heap pools' peak use since the last reset) in MB, and a function resetting the peaks."""
    jvm = spark.sparkContext._jvm
    management = jvm.java.lang.management.ManagementFactory
    pools = [p for p in management.getMemoryPoolMXBeans() if str(p.getType()) == "Heap memory"]

    def read():
        used = management.getMemoryMXBean().getHeapMemoryUsage().getUsed() / 2**20
        return used, sum(p.getPeakUsage().getUsed() for p in pools) / 2**20

    def reset():
        jvm.java.lang.System.gc()
        for pool in pools:
            pool.resetPeakUsage()

    return read, reset
