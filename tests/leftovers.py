"""What a `make test` leaves in the temporary directory (issue 57): nothing.

    python tests/leftovers.py start   records the tfbarrier directories there before the suite
    python tests/leftovers.py check   after it: waits for tfbarrier's processes to end, then fails naming every
                                      tfbarrier directory the suite added that is still there, and only
                                      then sweeps as the next start on the host would (workdirs.sweep)

Counted before the sweep: a directory still there is one the product failed to remove, whether its owner still
runs (a process left behind), is gone (exited without its cleanup), or was never recorded (made without
workdirs.make). A test that kills a driver on purpose gives it a temporary directory of its own and checks there
that the sweep removes what the kill left (test_saving), so none of that belongs here."""

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
    left = sorted(set(workdirs.leftovers()) - before)
    print(f"the suite's end: {len(left)} tfbarrier directories left in {tempfile.gettempdir()}, "
          f"{len(running)} tfbarrier processes running")
    for line in running + [f"{path} ({owner(path)})" for path in left]:
        print("  " + line)
    workdirs.sweep(force=True)  # after counting: what the sweep removes was left all the same
    return 1 if left or running else 0


def owner(directory):
    """Whose the directory is, in words: what its owner record names, and whether that process runs."""
    try:
        with open(os.path.join(directory, workdirs.OWNER_FILE)) as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return "no owner record"
    return f"owner {pid} {'still runs' if psutil.pid_exists(pid) else 'is gone'}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
