"""Warm start: each Spark Python worker keeps one spare training process for its next task.

Importing TensorFlow is most of a training process's start-up (about 4.5 s of a warm fit's time to
first step on the benchmark machine). A spare has imported it and waits for a job, nothing more: no
strategy, no TF_CONFIG, no thread settings, so it is as good as a fresh process for any task whose
Python and environment match. A task takes the spare that matches, or starts a fresh process;
after it succeeds it leaves a new spare behind. A spare dies with its Spark Python worker
(PR_SET_PDEATHSIG and a parent watchdog, as every training process), so it lives no longer than the
Python worker Spark keeps for reuse. ``spark.tfbarrier.warmStart=false`` turns spares off.
"""

from .launcher import TrainingProcess

_spare = None  # (key, TrainingProcess): this Python worker's spare


def key(python, env):
    """What a process must match to be reused: its Python and its whole environment."""
    return python, tuple(sorted(env.items()))


def take(wanted):
    """The spare for ``wanted`` (a ``key``) if this worker has a live one, else None; a spare that
    does not match is stopped (the next task is more likely to look like this one)."""
    global _spare
    spare, _spare = _spare, None
    if spare is None:
        return None
    spare_key, process = spare
    if spare_key == wanted and process.alive():
        return process
    process.stop(grace=0)
    return None


def leave(python, env):
    """Start the spare for the next task like this one (it imports TensorFlow in the background)."""
    global _spare
    discard()
    _spare = (key(python, env), TrainingProcess(env, python))


def discard():
    global _spare
    spare, _spare = _spare, None
    if spare is not None:
        spare[1].stop(grace=0)
