"""What runs inside a training process: ``python -m tfbarrier.spark.training_process FD``, started by a
barrier task through launcher.py.

It imports TensorFlow (or a spare's keeper that did forks it: spares.py), then waits for its job,
reserves a port and reports it, waits for TF_CONFIG from its task and runs the job's ``execute``
(spark/job.py's seams: fitting/job.py, functions/jobs.py). Its ProcessReport goes to RESULT_FILE, an error to ERROR_FILE, in the task's
work directory (protocol.py).
"""

import faulthandler
import json
import os
import socket
import sys
import threading
import time
import traceback

from tfbarrier import faults, settings
from tfbarrier.spark import protocol, rendezvous, workdirs
from tfbarrier.spark.launcher import name_process


def _exit_with_parent():
    """Backstop for PR_SET_PDEATHSIG (not on every OS): exit once the task's process is gone."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(faults.EXIT_FAILED)

    threading.Thread(target=watch, daemon=True, name="tfbarrier-parent-watch").start()


def import_tensorflow():
    """(tf, None), or (None, the exception) for the job to raise if it needs TensorFlow (fit does;
    run and apply do without it when the environment has none)."""
    try:
        import tensorflow as tf

        if os.environ.get(settings.KERAS3_PRELOAD_ENV) == "1":
            import keras  # noqa: F401 - a native Keras 3 fit's (fitting/flavors.py)
    except Exception as exc:  # noqa: B902 - raised later, in the job's work directory
        return None, exc
    return tf, None


def onednn_on():
    """Whether this process's TensorFlow runs oneDNN's kernels and their memory pool; None where TensorFlow is not
    imported here (ModelSize.of then counts the pool without oneDNN, the larger estimate)."""
    if "tensorflow" not in sys.modules:
        return None
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # a TensorFlow without it: assume its default on x86, oneDNN on
        return True
    return bool(_pywrap_util_port.IsMklEnabled())


def _configure_runtime(tf, threads):
    """Thread pools and the CPU allocator are fixed when TensorFlow's context starts, which importing
    it does not do: a spare imported it before the job said how many threads."""
    if tf is None:
        return
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    if not onednn_on():
        os.environ.setdefault(settings.CPU_POOL_ENV, "true")  # see settings


def serve(job, channel, tf, import_error):
    """Report a port, take TF_CONFIG and run the job; its ProcessReport."""
    if tf is None and (job.needs_tensorflow or not isinstance(import_error, ImportError)):
        raise import_error
    _configure_runtime(tf, job.tf_threads)
    port = rendezvous.reserve_port()
    if not job.tensorflow_server:
        port.listen()  # peers that come early wait in its backlog
    channel.send(protocol.PORT, port=port.getsockname()[1])
    config = channel.wait_for(protocol.CONFIG)
    os.environ[settings.TF_CONFIG_ENV] = json.dumps(config["tf_config"])
    if job.tensorflow_server:
        port.close()  # TensorFlow binds it next, in MultiWorkerMirroredStrategy()
    else:
        config["listener"] = port
    return job.execute(tf, config, channel)


def _move_output(previous_log, workdir):
    """From now on the output goes to the task's log, after what the process wrote before."""
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(os.path.join(workdir, protocol.LOG_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with open(previous_log, "rb") as f:
        os.write(log, f.read())
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def main(argv):
    """A process started for a task (launcher.py): it imports TensorFlow itself."""
    name_process("tfb-starting")  # what `ps -o comm` shows while TensorFlow imports
    tf, import_error = import_tensorflow()
    return run(int(argv[1]), tf, import_error, time.time())


def run(fd, tf, import_error, imported):
    """Wait for the job on the channel ``fd`` and run it, TensorFlow imported (at ``imported``) by this
    process or by the keeper it was forked from (spares.py); the exit code."""
    _exit_with_parent()
    faulthandler.register(protocol.STACKS_SIGNAL, all_threads=True)  # to fd 2, the task's log once adopted
    channel = protocol.Channel(socket.socket(fileno=fd))
    gpus = os.environ.get(settings.GPUS_ENV)  # fixed since TensorFlow's import: it reads it once
    name_process("tfb-spare")  # ready, until a task adopts it
    message = channel.wait_for(protocol.JOB)
    workdir = message["workdir"]
    if not workdirs.is_private(workdir):  # never a job, a log or a pickle from a place another user writes
        return faults.EXIT_FAILED
    name_process("tfb-worker")
    _move_output(message["previous_log"], workdir)
    os.environ.update(message["env"])
    try:
        job = protocol.read_pickle(workdir, protocol.JOB_FILE)
        report = serve(job, channel, tf, import_error)
        report.gpus = gpus
        # Zero for a spare, which imported TensorFlow before its task needed it.
        report.timings["tensorflow_import"] = max(0.0, imported - message["sent_at"])
        protocol.write_pickle(workdir, protocol.RESULT_FILE, report)
        channel.send(protocol.DONE)
    except BaseException as exc:  # noqa: B902 - every failure must reach the driver
        code = faults.exit_code(exc)
        if code == faults.EXIT_FAILED:  # a port clash is no bug to show
            traceback.print_exc()
        protocol.write_error(workdir, exc)
        return code
    return faults.EXIT_OK


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: TensorFlow's collective threads can stall it
