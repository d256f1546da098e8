"""The training process: ``python -m tfbarrier.worker FD``, started by a barrier task.

It imports TensorFlow, then waits for its job (at once, or later as a spare: see spares.py),
reserves a port and reports it, waits for TF_CONFIG from its task, then either trains the job's
model under MultiWorkerMirroredStrategy on its shard (fit) or calls the user's function (run,
apply). Its result goes to ``result.pkl``, an error to ``error.json``, in the task's work directory.
"""

import contextlib
import json
import os
import pickle
import socket
import sys
import threading
import time
import traceback

import cloudpickle

from . import rendezvous, shards, validation
from .errors import ColumnError, PortClashError
from .model_spec import save_archive, weights_checksum
from .process import ERROR_FILE, LOG_FILE, PORT_CLASH_EXIT_CODE, Channel, name_process

JOB_FILE = "job.pkl"
RESULT_FILE = "result.pkl"
_PORT_CLASH_SIGNS = ("Could not start gRPC server", "Address already in use")


def _exit_with_parent():
    """Backstop for PR_SET_PDEATHSIG (not on every OS): exit once the task's process is gone."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="tfbarrier-parent-watch").start()


def _wait_for(channel, event):
    while True:
        message = channel.poll(None)
        if message.get("event") == event:
            return message


def _is_port_clash(exc):
    return any(sign in str(exc) for sign in _PORT_CLASH_SIGNS)


@contextlib.contextmanager
def _port_clash_is_retryable():
    """Where TensorFlow binds its port: a taken port becomes a PortClashError, which the driver retries."""
    try:
        yield
    except Exception as exc:
        if _is_port_clash(exc):
            raise PortClashError(str(exc)) from exc
        raise


def _import_tensorflow():
    """(tf, None), or (None, the exception) for the job to raise if it needs TensorFlow (fit does;
    run and apply do without it when the environment has none)."""
    try:
        import tensorflow as tf
    except Exception as exc:  # noqa: B902 - raised later, in the job's work directory
        return None, exc
    return tf, None


def _set_threads(tf, threads):
    """Thread pools are fixed when TensorFlow's context starts, which importing it does not do."""
    if tf is not None and threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))


def _callbacks(channel, job, is_chief):
    """tfbarrier's own Keras callbacks: step clock and progress heartbeat, the epoch log, and
    BackupAndRestore when there is a checkpoint directory; then the user's."""
    import tf_keras

    class Progress(tf_keras.callbacks.Callback):
        """Counts steps, notes the first one, and tells the task (at most once a second) that
        training moves: the task's stall watchdog listens for it."""

        def __init__(self):
            super().__init__()
            self.steps = 0  # steps run by this process
            self.skipped = 0  # steps of the epochs a resumed run did not have to run again
            self.first_step_at = None
            self._last_sent = 0.0

        def _send(self, **message):
            self._last_sent = time.monotonic()
            channel.send(event="progress", steps=self.skipped + self.steps, **message)

        def on_train_begin(self, logs=None):
            self._send(total_steps=self.params["epochs"] * self.params["steps"])

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.first_step_at is None:
                self.first_step_at = time.time()
            if time.monotonic() - self._last_sent >= 1.0:
                loss = (logs or {}).get("loss")
                self._send(loss=None if loss is None else float(loss))

        def on_epoch_begin(self, epoch, logs=None):
            if self.steps == 0:
                self.skipped = epoch * self.params["steps"]

        def on_epoch_end(self, epoch, logs=None):
            self._send(epoch=epoch, logs={k: float(v) for k, v in (logs or {}).items()})

    class EpochLog(tf_keras.callbacks.Callback):
        """Per-epoch logs across resumed attempts. The chief keeps them in the checkpoint directory
        before BackupAndRestore saves the epoch, so the log never lags the checkpoint; on resume,
        entries past the restored epoch are dropped."""

        def __init__(self):
            super().__init__()
            self.path = os.path.join(job.checkpoint_dir, "epochs.json") if job.checkpoint_dir else None
            self.epochs = []
            self.initial_epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            if self.initial_epoch is None:
                self.initial_epoch = epoch
                if self.path and os.path.exists(self.path):
                    with open(self.path) as f:
                        self.epochs = json.load(f)[:epoch]

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append({k: float(v) for k, v in (logs or {}).items()})
            if self.path and is_chief:
                tmp = self.path + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(self.epochs, f)
                os.replace(tmp, self.path)

    progress, epoch_log = Progress(), EpochLog()
    callbacks = [progress, epoch_log]
    if job.checkpoint_dir:
        callbacks.append(tf_keras.callbacks.BackupAndRestore(os.path.join(job.checkpoint_dir, "backup")))
    if job.tensorboard_dir and is_chief:
        callbacks.append(tf_keras.callbacks.TensorBoard(job.tensorboard_dir))
    if job.callbacks:
        callbacks.extend(cloudpickle.loads(job.callbacks)())
    return progress, epoch_log, callbacks


def _resident_mb():
    """(current, peak) resident memory of this process in MB (current is None off Linux)."""
    import resource

    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        current = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
    return current, peak / (2**20 if sys.platform == "darwin" else 1024)


def _check_input(shard, input_shape):
    """A model function's input shape is known only here."""
    if shard.images:
        validation.check_image_input(input_shape)
    else:
        validation.check_input_width(shard.width, input_shape)


def _train(tf, model, dataset, shard, input_shape, **fit_args):
    """``model.fit``; an image that does not decode becomes a ColumnError naming its row."""
    try:
        model.fit(dataset, verbose=0, **fit_args)
    except tf.errors.InvalidArgumentError:  # what decode_image raises (a failed peer is another error)
        bad = shards.first_undecodable(shard, input_shape) if shard.images else None
        if bad is None:
            raise
        raise ColumnError(
            f"row {bad[0]} of this worker's partition does not decode as an image ({bad[1]}): the image "
            "column must hold whole PNG, JPEG, GIF or BMP files; filter out the broken ones first"
        ) from None


def _fit(tf, job, config, channel, timings):
    index = config["tf_config"]["task"]["index"]
    shard = shards.Shard.open(config["shard"], config["rows"])
    started = time.time()
    with _port_clash_is_retryable():
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if job.seed is not None:
        import tf_keras

        tf_keras.utils.set_random_seed(job.seed)
    with strategy.scope():
        model = job.model.build()
    input_shape = tuple(model.input_shape[1:])
    _check_input(shard, input_shape)
    baseline_mb, _ = _resident_mb()
    seed = None if job.seed is None else job.seed + index
    dataset = strategy.distribute_datasets_from_function(
        shards.dataset_fn(shard, input_shape, job.batch_size, seed, job.shuffle, job.shuffle_buffer)
    )
    timings["strategy_and_model"] = time.time() - started
    progress, epoch_log, callbacks = _callbacks(channel, job, is_chief=index == 0)
    started = time.time()
    _train(tf, model, dataset, shard, input_shape, epochs=job.epochs, steps_per_epoch=config["steps_per_epoch"],
           callbacks=callbacks)
    timings["training"] = time.time() - started
    if progress.first_step_at is not None:  # None when a resumed attempt had no epoch left to run
        timings["first_step"] = progress.first_step_at - started
    weights = model.get_weights()
    result = {
        "history": {key: [epoch[key] for epoch in epoch_log.epochs] for key in (epoch_log.epochs or [{}])[0]},
        "initial_epoch": epoch_log.initial_epoch or 0,
        "checksum": weights_checksum(weights),
        "memory": {"baseline_mb": baseline_mb, "peak_mb": _resident_mb()[1]},
        "steps": progress.steps,
        "first_step_at": progress.first_step_at,
        "finished_at": time.time(),
    }
    if index == 0:
        result["weights"] = weights
    if job.model.flavor == "function":
        # Every worker saves (variable reads may be collective); only the chief's archive is kept.
        archive = save_archive(model)
        if index == 0:
            result["archive"] = archive
    return result


def _run(job, config):
    fn, args, kwargs = cloudpickle.loads(job.function)
    started = time.time()
    with _port_clash_is_retryable():  # the user's function builds the strategy
        value = fn(*args, **kwargs)
    result = {"training": time.time() - started}
    if config["tf_config"]["task"]["index"] == 0:
        result["value"] = cloudpickle.dumps(value)
    return result


def _apply(job, config):
    """Call the user's function on this task's partition; its frame comes back as Arrow IPC bytes."""
    import pyarrow as pa

    fn = cloudpickle.loads(job.function)
    tf_config = config["tf_config"]
    index = tf_config["task"]["index"]
    barrier = {
        "address": tf_config["cluster"]["worker"][index],
        "partition": index,
        "num_workers": len(tf_config["cluster"]["worker"]),
        "tf_config": json.dumps(tf_config),
    }
    started = time.time()
    frame = fn(shards.read_partition(config["shard"], job.input_schema), barrier)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if job.output_schema is not None:
        missing = [name for name in job.output_schema.names if name not in table.column_names]
        if missing:
            raise ColumnError(f"the function's result has no column(s) {missing}; it has {table.column_names}")
        table = table.select(job.output_schema.names).cast(job.output_schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return {"training": time.time() - started, "table": sink.getvalue().to_pybytes()}


def serve(job, channel, tf, import_error, timings):
    if tf is None and (job.kind == "fit" or not isinstance(import_error, ImportError)):
        raise import_error
    _set_threads(tf, job.tf_threads)
    port = rendezvous.reserve_port()
    channel.send(event="port", port=port.getsockname()[1])
    config = _wait_for(channel, "config")
    os.environ["TF_CONFIG"] = json.dumps(config["tf_config"])
    port.close()  # TensorFlow binds it next, in MultiWorkerMirroredStrategy()
    if job.kind == "fit":
        result = _fit(tf, job, config, channel, timings)
    elif job.kind == "apply":
        result = _apply(job, config)
    else:
        result = _run(job, config)
    result["timings"] = timings
    result["python_prefix"] = sys.prefix
    return result


def _move_output(previous_log, workdir):
    """From now on the output goes to the task's log, after what the process wrote before."""
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(os.path.join(workdir, LOG_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    with open(previous_log, "rb") as f:
        os.write(log, f.read())
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def _write_error(workdir, exc):
    info = {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc),
            "traceback": traceback.format_exc()}
    with open(os.path.join(workdir, ERROR_FILE), "w") as f:
        json.dump(info, f)


def main(argv):
    _exit_with_parent()
    name_process("tfb-spare")  # until a task adopts it: what `ps -o comm` shows
    channel = Channel(socket.socket(fileno=int(argv[1])))
    tf, import_error = _import_tensorflow()
    imported = time.time()
    message = _wait_for(channel, "job")
    name_process("tfb-worker")
    workdir = message["workdir"]
    _move_output(message["previous_log"], workdir)
    os.environ.update(message["env"])
    # Zero for a spare, which imported TensorFlow before its task needed it.
    timings = {"tensorflow_import": max(0.0, imported - message["sent_at"])}
    try:
        with open(os.path.join(workdir, JOB_FILE), "rb") as f:
            job = pickle.load(f)
        result = serve(job, channel, tf, import_error, timings)
        with open(os.path.join(workdir, RESULT_FILE), "wb") as f:
            pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        channel.send(event="done")
    except PortClashError as exc:
        _write_error(workdir, exc)
        return PORT_CLASH_EXIT_CODE
    except BaseException as exc:  # noqa: B902 - every failure must reach the driver
        traceback.print_exc()
        _write_error(workdir, exc)
        return 1
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: TensorFlow's collective threads can stall it
