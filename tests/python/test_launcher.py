"""The task's handle on its training process (launcher.py)."""

import os
import time

from tfbarrier.launcher import TrainingProcess


def test_a_training_process_log_does_not_open_with_pythons_runpy_warning():
    # The package's own imports once loaded the entry module before `python -m` ran it, so every worker's log
    # (and so every WorkerError's log tail) started with "RuntimeWarning: 'tfbarrier.worker' found in sys.modules".
    process = TrainingProcess(dict(os.environ, PYTHONWARNINGS="default"))
    try:
        time.sleep(3)  # runpy warns before the module runs, at once
        assert process.alive()
        assert "found in sys.modules" not in process.log_tail()
    finally:
        process.stop(grace=0)
