"""What runs in each Spark barrier task (the executor's Python worker; no TensorFlow here).

One task: take this Python worker's spare training process, which has imported TensorFlow already,
or start one (it imports TensorFlow while the task writes its shard), stream the partition to the
shard file, gather every peer's host, port and shard size (through the driver, else the barrier's
allGather), hand TF_CONFIG and the agreed steps per epoch to the training process, wait for its
result and yield it to the driver. The work directory and the process are gone when the task ends,
however it ends; a task that succeeded leaves a spare for the next one (spares.py).
"""

import dataclasses
import os
import pickle
import shutil
import tempfile
import time

import pyarrow as pa

from . import environment, errors, gpus, job as job_module, parquet_source, progress, rendezvous, shards, spares
from .errors import InvalidArgumentError, TfBarrierError, WorkerError
from .process import LOG_FILE, TrainingProcess
from .worker import JOB_FILE, RESULT_FILE

# A task's result travels as rows of at most CHUNK bytes: Spark Connect caps the size of a message.
RESULT_SCHEMA = "index int, chunk int, payload binary"
_ARROW_RESULT_SCHEMA = pa.schema([("index", pa.int32()), ("chunk", pa.int32()), ("payload", pa.binary())])
CHUNK = 16 * 2**20
STARTUP_TIMEOUT = 300  # seconds for the training process to import TensorFlow and report its port
EXIT_GRACE = 30  # seconds for a finished training process to exit before it is killed


def _training_env():
    """The training process's environment, the same for every task of this Python worker (so that a
    spare can serve any of them); what differs per task goes in ``_task_env``."""
    env = dict(os.environ)
    for name in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", job_module.ATTEMPT_ENV):
        env.pop(name, None)
    for key, value in job_module.TRAINING_ENV_DEFAULTS.items():
        env.setdefault(key, value)
    env.update(job_module.TRAINING_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _task_env(job, context, index):
    return {"CUDA_VISIBLE_DEVICES": gpus.visible_devices(job.gpus, context, index, os.environ),
            job_module.ATTEMPT_ENV: str(job.attempt)}


def _training_process(job, python, env):
    """This worker's spare when it matches (TensorFlow already imported), else a fresh process."""
    spare = spares.take(spares.key(python, env)) if job.warm_start else None
    return (spare, True) if spare is not None else (TrainingProcess(env, python), False)


def _check_shards(peers):
    empty = [i for i, peer in enumerate(peers) if peer["rows"] == 0]
    if empty:
        raise InvalidArgumentError(
            f"partition(s) {empty} of the training data are empty, so those workers have nothing to "
            "train on: repartition the DataFrame (df.repartition(num_workers)) or use fewer workers"
        )


def _train(job, context, batches, workdir, reporter):
    started = time.time()
    index = context.partitionId()
    host = rendezvous.task_host(context)
    reporter.event(f"task started on {host} (attempt {job.attempt})")
    timings = {}
    if job.tf_threads is None:  # one intra-op thread per CPU Spark gave this task
        job = dataclasses.replace(job, tf_threads=context.cpus())
    with open(os.path.join(workdir, JOB_FILE), "wb") as f:
        pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)
    python, environment_info = environment.resolve(job.env)
    if environment_info is not None:
        timings["environment"] = environment_info["seconds"]
        what = "built" if environment_info["built"] else "found"
        reporter.event(f"environment {environment_info['path']} {what} in {environment_info['seconds']:.1f} s")
    env, task_env = _training_env(), _task_env(job, context, index)
    spawned = time.time()
    process, warm = _training_process(job, python, env)
    with process:
        process.adopt(workdir, task_env, index, host)
        if job.verbose >= 2:
            reporter.follow(os.path.join(workdir, LOG_FILE))
        shard = os.path.join(workdir, "shard.arrow")
        shard_checksum = None
        if job.kind == "fit":
            if job.source is not None:  # a plain Parquet scan, read here rather than through Spark
                batches = parquet_source.read(job.source[index], job.layout.columns)
            rows, shard_checksum = shards.write(batches, shard, job.layout)
        elif job.kind == "apply":
            rows = shards.write_partition(batches, shard)
        else:
            rows = 0
        timings["data_shard"] = time.time() - spawned  # while the training process imports TensorFlow
        reporter.event(f"partition written: {rows} rows")
        port = process.receive("port", timeout=STARTUP_TIMEOUT)["port"]
        timings["worker_start"] = time.time() - spawned
        reporter.event(f"training process ready on port {port}")
        gathered = time.time()
        peers, how = rendezvous.gather(context, {"host": host, "port": port, "rows": rows}, reporter, job.attempt)
        timings["rendezvous"] = time.time() - gathered
        reporter.event(f"rendezvous: {len(peers)} workers (through {how})")
        if job.kind == "fit":
            _check_shards(peers)
        steps = job.steps_per_epoch or rendezvous.steps_per_epoch([p["rows"] for p in peers], job.batch_size)
        process.send(
            event="config", tf_config=rendezvous.tf_config(peers, index), steps_per_epoch=steps, shard=shard,
            rows=rows,
        )
        forward = lambda message: reporter.send("progress", **message)  # noqa: E731
        process.receive("done", stall_timeout=job.stall_timeout, on_message=forward)
        with open(os.path.join(workdir, RESULT_FILE), "rb") as f:
            result = pickle.load(f)
        process.stop(grace=EXIT_GRACE)
    if job.warm_start:
        spares.leave(python, env)
    result["timings"].update(timings)
    result.update(index=index, host=host, port=port, rows=rows, shard_checksum=shard_checksum, steps_per_epoch=steps,
                  executor=context.getTaskInfos()[index].address, gpus=task_env["CUDA_VISIBLE_DEVICES"],
                  environment=environment_info, warm_start=warm, task_started_at=started)
    return result


def barrier_function(job):
    """The function handed to ``mapInArrow(..., barrier=True)``: one result row per task."""

    def run_task(batches):
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        workdir = tempfile.mkdtemp(prefix=f"tfbarrier-{job.job_id}-{context.partitionId()}-")
        reporter = progress.Reporter(job.progress, context.partitionId())
        try:
            result = _train(job, context, batches, workdir, reporter)
        except TfBarrierError as exc:
            raise RuntimeError(errors.encode(exc)) from None
        except Exception as exc:
            error = WorkerError(
                f"task {context.partitionId()} failed: {type(exc).__name__}: {exc}",
                worker=context.partitionId(), exc_type=type(exc).__name__,
            )
            raise RuntimeError(errors.encode(error)) from exc
        finally:
            reporter.close()
            shutil.rmtree(workdir, ignore_errors=True)
        payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        for number, start in enumerate(range(0, len(payload), CHUNK)):
            yield pa.RecordBatch.from_arrays(
                [pa.array([result["index"]], pa.int32()), pa.array([number], pa.int32()),
                 pa.array([payload[start:start + CHUNK]], pa.binary())],
                schema=_ARROW_RESULT_SCHEMA,
            )

    return run_task
