"""Live progress on the driver: what the tasks' messages (driver_link.py) look like to the user.

``verbose`` 0 shows nothing; 1 one progress bar for the whole job (the chief's steps, its loss and
the samples per second) plus a line per epoch; 2 also every worker's events and log lines, prefixed
with ``[worker i]``. When no task reached the driver, the user is warned that progress was
unavailable (training itself never depends on it).
"""

import sys
import warnings


def samples_per_second(mark, now, steps, global_batch):
    """The chief's training rate since ``mark`` (the received_at time and steps of an earlier report) at
    ``steps`` received ``now``; None before two reports apart in time, or without a global batch."""
    if not mark or not global_batch or now <= mark[0] or steps <= mark[1]:
        return None
    return (steps - mark[1]) * global_batch / (now - mark[0])


class ProgressUnavailableWarning(UserWarning):
    """No worker could send progress to the driver (a firewall between executors and driver?)."""


class ProgressDisplay:
    """Shows the messages handed to ``show`` (from the driver link's thread, one at a time)."""

    def __init__(self, verbose=1, global_batch=None, out=None, on_progress=None):
        self.verbose = verbose
        self.on_progress = on_progress  # also gets the chief's progress messages, whatever the verbosity
        self.global_batch = global_batch
        self.out = out or sys.stderr
        self._bar = None
        self._first = None  # (time, steps) of the chief's first step report: the rate starts there
        self._postfix = {}  # the bar's last loss and rate, kept across messages that lack one

    def show(self, message):
        kind, worker = message.get("kind"), message.get("worker")
        if kind == "progress" and worker == 0 and self.on_progress is not None:
            self.on_progress(message)
        if kind == "log" and self.verbose >= 2:
            self._write(f"[worker {worker}] {message['line']}")
        elif kind == "event" and self.verbose >= 2:
            self._write(f"[worker {worker}] {message['event']}")
        elif kind == "progress" and worker == 0 and self.verbose >= 1:
            self._progress(message)

    def _progress(self, message):
        from tqdm.auto import tqdm

        total = message.get("total_steps")
        if self._bar is None and total:
            self._bar = tqdm(total=total, unit="step", file=self.out, dynamic_ncols=True, leave=True)
        if self._bar is None:
            return
        steps = message.get("steps", 0)
        self._bar.update(max(0, steps - self._bar.n))
        postfix = self._postfix
        if message.get("loss") is not None:
            postfix["loss"] = f"{message['loss']:.4f}"
        now = message["received_at"]
        if self._first is None and steps:
            self._first = (now, steps)
        else:
            rate = samples_per_second(self._first, now, steps, self.global_batch)
            if rate is not None:
                postfix["samples/s"] = f"{rate:,.0f}"
        self._bar.set_postfix(postfix, refresh=False)
        if message.get("epoch") is not None and message.get("logs"):
            metrics = "  ".join(f"{k} {v:.4f}" for k, v in message["logs"].items())
            self._write(f"epoch {message['epoch'] + 1}: {metrics}")

    def _write(self, text):
        if self._bar is not None:
            self._bar.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    def unavailable(self, why):
        if self.verbose:
            warnings.warn(f"no progress can reach the driver: {why}. The job runs without live progress, its "
                          "tasks meet through Spark's allGather, and its files (the model's weights) travel through "
                          "Spark: the driver's JVM needs room for them (spark.driver.memory)",
                          ProgressUnavailableWarning, stacklevel=4)

    def close(self, server):
        """End the display of a job whose tasks were to reach ``server`` (a DriverServer; None when the
        driver could not open one)."""
        if self._bar is not None:
            self._bar.close()
        if server is not None and not server.workers_heard() and self.verbose:
            warnings.warn(
                f"no progress reached the driver from the workers (they could not connect to "
                f"{server.host}:{server.port}; a firewall?): the job ran, but without live progress",
                ProgressUnavailableWarning, stacklevel=4,
            )


class SearchBar:
    """tune's display: one bar of trials done out of all, with the best value so far; at verbose=2
    also a line per finished trial."""

    def __init__(self, total, verbose, out=None):
        self.verbose, self.out = verbose, out or sys.stderr
        self._bar = None
        if verbose >= 1:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, unit="trial", file=self.out, dynamic_ncols=True, leave=True)

    def trial_done(self, line, best=None):
        """A trial ended: ``line`` says how (shown at verbose=2), ``best`` ("val_loss=0.1234") is the
        best so far."""
        if self._bar is None:
            return
        if best is not None:
            self._bar.set_postfix_str(f"best {best}", refresh=False)
        self._bar.update(1)
        if self.verbose >= 2:
            self._bar.write(line, file=self.out)

    def close(self):
        if self._bar is not None:
            self._bar.close()
