"""Fault injection for tests, through fit()'s documented ``callbacks=`` hook: each function here
returns a callbacks factory. The faults act in the chosen worker (read from TF_CONFIG), at the first
batch end from step 2 of their epoch on (with steps_per_execution > 1, Keras reports batch ends every
few steps); ``kill`` only in the first submission of the job (TFBARRIER_ATTEMPT). ``slow_steps`` slows
every batch end, of every worker or of the one given; ``record_steps`` injects nothing: it notes the
steps each worker ran in each submission."""

import json
import os
import signal
import time


def _worker_index():
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def _callback(on_batch_end):
    import tf_keras

    class Fault(tf_keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            on_batch_end(self.epoch, batch)

    return Fault()


def _note(path):
    """Record when the fault fires and the ports of the cluster, for the test to check."""
    with open(path, "w") as f:
        json.dump({"at": time.time(), "workers": json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]}, f)


def raise_error(worker, epoch, note):
    def factory():
        def act(current_epoch, batch):
            if _worker_index() == worker and current_epoch == epoch and batch >= 2:
                _note(note)
                raise ValueError(f"injected failure in worker {worker} at epoch {epoch}")

        return [_callback(act)]

    return factory


def hang(worker, epoch):
    def factory():
        def act(current_epoch, batch):
            if _worker_index() == worker and current_epoch == epoch and batch >= 2:
                time.sleep(3600)

        return [_callback(act)]

    return factory


def slow_steps(seconds, worker=None):
    """Healthy but slow steps in every worker, or only in ``worker``: each batch end comes ``seconds``
    later (over 1 s: the training process reports its running loss after every step)."""

    def factory():
        def act(epoch, batch):
            if worker is None or _worker_index() == worker:
                time.sleep(seconds)

        return [_callback(act)]

    return factory


def slow_setup(seconds):
    """Every worker's set-up (before its first step) takes ``seconds`` more, as a large model's build,
    weights and first trace do on a loaded machine."""

    def factory():
        time.sleep(seconds)
        return []

    return factory


def slow_train_end(seconds):
    """Every worker's fit takes ``seconds`` to return after its last step, as when tf_keras's deletion of
    its data iterator waits for a tf.data thread."""

    def factory():
        import tf_keras

        class SlowEnd(tf_keras.callbacks.Callback):
            def on_train_end(self, logs=None):
                time.sleep(seconds)

        return [SlowEnd()]

    return factory


def _kill(worker, epoch, first_attempt_only):
    def factory():
        def act(current_epoch, batch):
            wanted = not first_attempt_only or os.environ.get("TFBARRIER_ATTEMPT") == "1"
            if wanted and _worker_index() == worker and current_epoch == epoch and batch >= 2:
                os.kill(os.getpid(), signal.SIGKILL)

        return [_callback(act)]

    return factory


def kill_first_attempt(worker, epoch):
    """Kill the worker in the job's first submission only: a retry succeeds."""
    return _kill(worker, epoch, first_attempt_only=True)


def kill_after_step(worker, epoch, step):
    """Kill the worker in the first submission, at the end of ``step`` of ``epoch`` (from 0), after
    tfbarrier's own callbacks (a checkpoint) are done with that step."""
    def factory():
        def act(current_epoch, batch):
            if (os.environ.get("TFBARRIER_ATTEMPT") == "1" and _worker_index() == worker and current_epoch == epoch
                    and batch == step):
                os.kill(os.getpid(), signal.SIGKILL)

        return [_callback(act)]

    return factory


def kill_always(worker, epoch):
    """Kill the worker in every submission of the job: retries cannot help."""
    return _kill(worker, epoch, first_attempt_only=False)


def control_at_step(ask, epoch, step, worker=0, target=1):
    """In the job's first submission, worker ``worker`` calls ``ask(host)`` once, at the first batch end
    from ``step`` of ``epoch`` (from 0) on, with the host of worker ``target`` (its TF_CONFIG address):
    e.g. support/hosts.py's ``request`` to cut that host's link or stop it, through the test's Operator."""
    def factory():
        fired = []

        def act(current_epoch, batch):
            if (not fired and os.environ.get("TFBARRIER_ATTEMPT") == "1" and _worker_index() == worker
                    and (current_epoch, batch) >= (epoch, step)):
                fired.append(True)
                address = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][target]
                ask(address.rsplit(":", 1)[0])

        return [_callback(act)]

    return factory


def record_steps(directory):
    """Every worker notes each step it ran (at its batch end, after tfbarrier's own callbacks: a checkpoint
    due at that step is saved) as a line "epoch step" in ``directory``/<attempt>-<worker>: what each
    submission of the job ran, counted apart from tfbarrier's own record. ``directory``: one every worker
    sees. Use steps_per_execution=1 (with more, a batch end comes every few steps)."""
    def factory():
        path = os.path.join(directory, f"{os.environ.get('TFBARRIER_ATTEMPT')}-{_worker_index()}")

        def act(epoch, batch):
            with open(path, "a") as f:
                f.write(f"{epoch} {batch}\n")

        return [_callback(act)]

    return factory


def recorded_steps(directory):
    """What record_steps noted in ``directory``: {(attempt, worker): [(epoch, step), ...] in order}."""
    found = {}
    for name in os.listdir(directory):
        attempt, worker = (int(part) for part in name.split("-"))
        with open(os.path.join(directory, name)) as f:
            found[attempt, worker] = [tuple(int(n) for n in line.split()) for line in f if line.strip()]
    return found
