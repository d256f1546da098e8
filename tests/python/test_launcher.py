"""The task's handle on its training process (launcher.py)."""

import os
import subprocess
import sys
import time

from tfbarrier.spark.launcher import TrainingProcess


def test_a_training_process_log_does_not_open_with_pythons_runpy_warning():
    # The package's own imports once loaded the entry module before `python -m` ran it, so every worker's log
    # (and so every WorkerError's log tail) started with "RuntimeWarning: 'tfbarrier.worker' found in sys.modules".
    process = TrainingProcess(dict(os.environ, PYTHONWARNINGS="default"))
    try:
        deadline = time.monotonic() + 120
        with open(f"/proc/{process.pid}/comm") as comm:  # main() names it first: runpy is behind it then
            while comm.read().strip() not in ("tfb-starting", "tfb-spare"):
                assert process.alive() and time.monotonic() < deadline, process.log_tail()
                time.sleep(0.05)
                comm.seek(0)
        assert "found in sys.modules" not in process.log_tail()
    finally:
        process.stop(grace=0)


_ALLOCATOR_PROBE = """
import tensorflow as tf
from tfbarrier.spark import training_process
training_process._configure_runtime(tf, 1)
tf.ones((256, 256))
try:
    print("pool", tf.config.experimental.get_memory_info("CPU:0")["peak"] > 0)
except ValueError:  # "Allocator stats not available": TensorFlow's plain CPU allocator
    print("plain")
"""


def _allocator_after_configure(**env):
    probe = subprocess.run([sys.executable, "-c", _ALLOCATOR_PROBE], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env))
    assert probe.returncode == 0, probe.stderr
    return probe.stdout.split()[-1]


def test_without_onednn_a_training_process_keeps_freed_tensors_in_a_pool_unless_the_user_said_otherwise():
    # Without oneDNN (TF_ENABLE_ONEDNN_OPTS=0 stands in for a CPU without AVX-512), TensorFlow's plain CPU
    # allocator maps and unmaps a step's tensors every step: a 2-worker fit of the slides' CNN ran at 0.41x one
    # process, against 0.59x with the pool (bench/README.md, "Speed without oneDNN"). The pool keeps statistics.
    assert _allocator_after_configure(TF_ENABLE_ONEDNN_OPTS="0") == "True"
    assert _allocator_after_configure(TF_ENABLE_ONEDNN_OPTS="0", TF_CPU_ALLOCATOR_USE_BFC="false") == "plain"
