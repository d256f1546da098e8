"""This process's resident memory sampled while a block runs, for tests that bound what a call holds."""

import threading

import psutil


class PeakMemory:
    """This process's resident memory, sampled every 20 ms while the block runs: ``growth``, peak less start."""

    def __enter__(self):
        self.process, self.stop = psutil.Process(), threading.Event()
        self.start = self.peak = self.process.memory_info().rss
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while not self.stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.growth = self.peak - self.start
