"""The task's handle on its training process (launcher.py)."""

import os
import time

from tfbarrier.launcher import TrainingProcess


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
