"""What a `make test` leaves in the temporary directory (issue 57): nothing.

    python tests/leftovers.py start   records the tfbarrier directories there before the suite
    python tests/leftovers.py check   after it: waits for tfbarrier's processes to end, sweeps as the next
                                      start on the host would (workdirs.sweep), and fails naming every
                                      tfbarrier directory the suite added that is still there

A directory still there is one whose owner still runs (a process left behind) or that has no owner record
(made without workdirs.make)."""

import os
import sys
import tempfile
import time

import psutil

from tfbarrier.spark import workdirs

RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "tmp-before-test.txt")
PROCESSES = ("tfbarrier.spark.training_process", "tfbarrier.spark.keeper")


def tfbarrier_processes():
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        command = " ".join(proc.info["cmdline"] or [])
        if any(module in command for module in PROCESSES):
            found.append(f"{proc.pid} {command[:120]}")
    return found


def main(what):
    if what == "start":
        os.makedirs(os.path.dirname(RECORD), exist_ok=True)
        with open(RECORD, "w") as f:
            f.writelines(path + "\n" for path in workdirs.leftovers())
        return 0
    with open(RECORD) as f:
        before = set(f.read().split())
    deadline = time.monotonic() + 60  # warm start's keepers end with their executors, a moment after Spark
    while tfbarrier_processes() and time.monotonic() < deadline:
        time.sleep(1)
    running = tfbarrier_processes()
    swept = workdirs.sweep(force=True)
    left = sorted(set(workdirs.leftovers()) - before)
    print(f"the suite's end: {len(swept)} directories of killed processes swept, {len(left)} left in "
          f"{tempfile.gettempdir()}, {len(running)} tfbarrier processes running")
    for line in running + left:
        print("  " + line)
    return 1 if left or running else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
