"""What runs in each Spark barrier task (the executor's Python worker; no TensorFlow here).

One task: ask this executor's keeper for a training process (forked from one that imported TensorFlow
already, spares.py), or start one (it imports TensorFlow while the task writes its shard), fetch the job's files (the
model's weights: transfer.py) and write the partition to the shard file (``job.write_input``) at the
same time, meet every peer (rendezvous.py, through the driver link), hand TF_CONFIG and the agreed
steps per epoch to the training process, wait for its report, send the files it reports (the
trained weights) to the driver and yield the task's WorkerResult. The work directory and the process
are gone when the task ends, however it ends; a task that succeeded leaves a keeper for the next ones
where there is none (spares.py).
"""

import dataclasses
import os
import shutil
import time

from tfbarrier import errors, faults, settings
from tfbarrier.errors import DriverUnreachableError, TfBarrierError, WorkerError
from tfbarrier.results import WorkerResult
from tfbarrier.spark import driver_link, environment, gpus, protocol, rendezvous, spares, transfer, workdirs
from tfbarrier.spark.launcher import TrainingProcess


def _training_env(job, context, index):
    """The training process's environment when it starts: the same for every task of this Python
    worker that has the same GPUs, so that a spare can serve them. Its GPUs are in it because
    TensorFlow reads CUDA_VISIBLE_DEVICES when it is imported, which a spare has done already."""
    env = {name: value for name, value in os.environ.items()
           if name not in settings.TASK_ENV and not _set_by_an_import(name, value)}
    for key, value in settings.TRAINING_ENV_DEFAULTS.items():
        env.setdefault(key, value)
    env.update(settings.TRAINING_ENV)
    env[settings.GPUS_ENV] = gpus.visible_devices(job.gpus, context, index, os.environ)
    if job.imports_keras3:  # while the task writes the shard (1 s here), and in the spare it leaves
        env[settings.KERAS3_PRELOAD_ENV] = "1"
    return env


def _set_by_an_import(name, value):
    """Whether ``name=value`` is what an import in this Python worker wrote (settings.IMPORT_SET_ENV)."""
    if name not in settings.IMPORT_SET_ENV:
        return False
    return settings.IMPORT_SET_ENV[name] in (None, value)


def _task_env(job):
    """What differs per task and TensorFlow does not read at import: sent with the job."""
    return {settings.ATTEMPT_ENV: str(job.attempt)}


def _row_counts(written):
    """What ``write_input`` wrote that the peers learn: its ``*rows`` counts."""
    return {name: value for name, value in written.items() if name.endswith("rows")}


def _written_event(written):
    """'partition written: 1200 rows, 300 validation rows (validation checksum ...)'."""
    counts = _row_counts(written).items()
    text = "partition written: " + ", ".join(f"{value} {name.replace('_', ' ')}" for name, value in counts)
    if written.get("validation_checksum"):
        text += f" (validation checksum {written['validation_checksum'][:16]})"
    return text


class _Starting:
    """The task's training process while the task writes its shard: a new process importing TensorFlow
    meanwhile, or the one this executor's keeper forks (spares.py), taken at once when the keeper has imported
    TensorFlow, else once the shard is written. ``adopt`` is called with the process as soon as there is one
    (it loads its job meanwhile); ``ready()`` gives it. Stopped however the task ends."""

    def __init__(self, job, python, env, adopt):
        self._job, self._python, self._env, self._adopt = job, python, env, adopt
        self._handover = self.process = None
        self.warm = False

    def __enter__(self):
        try:
            if self._job.spare_idle_timeout:
                self._handover = spares.request(self._python, self._env, self._job.spare_idle_timeout)
            if self._handover is None:
                self._have(TrainingProcess(self._env, self._python))
            elif self._handover.arrived():
                self._take()
        except BaseException:  # noqa: B902 - nothing left behind, whatever stopped it
            self.__exit__()
            raise
        return self

    def ready(self):
        if self._handover is not None:  # waits while the keeper still imports TensorFlow
            self._take()
        if self.process is None:  # the keeper ended as the task came
            self._have(TrainingProcess(self._env, self._python))
        return self.process

    def _take(self):
        process, self._handover = self._handover.receive(), None
        self.warm = process is not None
        if process is not None:
            self._have(process)

    def _have(self, process):
        self.process = process
        self._adopt(process)

    def __exit__(self, *exc):
        if self._handover is not None:
            self._handover.close()
        if self.process is not None:
            self.process.stop()


def _fetch_files(job, link, workdir, index, host):
    """Start fetching the job's files from the driver (transfer.Fetch); at once a DriverUnreachableError
    when they must come through a link this task could not open."""
    needed = [p for p in transfer.payloads_of(job) if p.data is None]
    if needed and not link.connected:
        raise DriverUnreachableError(
            f"worker {index} on {host} could not connect to the driver's link at {job.link['host']}:"
            f"{job.link['port']} to fetch the job's files", worker=index, host=host)
    return transfer.Fetch(job, link, workdir)


def _job_and_python(job, context, workdir, link, timings):
    """The job as this task runs it (its intra-op threads: the task's CPUs unless set), written for the
    training process, and the Python that runs it: (job, python, its environment's record or None)."""
    if job.tf_threads is None:  # one intra-op thread per CPU Spark gave this task
        job = dataclasses.replace(job, tf_threads=context.cpus())
    protocol.write_pickle(workdir, protocol.JOB_FILE, job)
    python, environment_info = environment.resolve(job.env)
    if environment_info is not None:
        timings["environment"] = environment_info["seconds"]
        what = "built" if environment_info["built"] else "found"
        link.event(f"environment {environment_info['path']} {what} in {environment_info['seconds']:.1f} s")
    return job, python, environment_info


def _meet(context, link, mine, attempt, timings):
    """The rendezvous with this task's ``mine`` (host, port, row counts): (the peers, how they met)."""
    gathered = time.time()
    peers, how = rendezvous.gather(context, link, mine, attempt)
    timings["rendezvous"] = time.time() - gathered
    link.event(f"rendezvous: {len(peers)} workers through {how} in {timings['rendezvous']:.3f} s")
    return peers, how


def _send_back(report, link, workdir, index):
    """The files the training process reported, on their way to the driver: (them, sent_bytes and send_seconds)."""
    sending = time.time()
    files = transfer.send_back(report.files, link, workdir, index)
    return files, {"sent_bytes": sum(p.size for p in files.values()), "send_seconds": time.time() - sending}


def _until_done(process, job, link, workdir, peers, index, host):
    """Forward the training process's progress to the driver until it is done: its ProcessReport. The
    stall watchdog counts from the first step (set-up sends nothing and has a budget of its own); a
    process that lost contact with a peer whose host went silent blames that peer (faults.py)."""
    stall = job.stall_timeout
    try:
        process.receive(protocol.DONE, stall_timeout=stall, on_message=lambda message: link.send("progress", **message),
                        armed_by=(lambda message: message.get("steps", 0) > 0) if stall else None,
                        setup_timeout=max(settings.SETUP_TIMEOUT, stall) if stall else None)
    except WorkerError as error:
        blamed = faults.blame_lost_peer(error, peers, index, host, lambda: rendezvous.silent_peers(peers, index),
                                        settings.PEER_PROBE_TIMEOUT)
        if faults.lost_contact(blamed):  # a live peer failed on its own: its task fails first, with the cause
            time.sleep(settings.CAUSE_FIRST_WAIT)  # (the ring sees a peer's exit at once, TensorFlow much later)
        raise blamed from None
    return protocol.read_pickle(workdir, protocol.RESULT_FILE)


def _run(job, context, batches, workdir, link):
    started = time.time()
    index = context.partitionId()
    host = rendezvous.task_host(context)
    link.event(f"task started on {host} (attempt {job.attempt})")
    fetching = _fetch_files(job, link, workdir, index, host)
    timings = {}
    job, python, environment_info = _job_and_python(job, context, workdir, link, timings)
    env, task_env = _training_env(job, context, index), _task_env(job)
    spawned = time.time()

    def adopt(process):
        process.adopt(workdir, task_env, index, host)
        if job.verbose >= 2:
            link.follow(os.path.join(workdir, protocol.LOG_FILE))

    with _Starting(job, python, env, adopt) as starting:
        shard = os.path.join(workdir, protocol.SHARD_FILE)
        written = job.write_input(batches, shard, index)
        counts = _row_counts(written)
        timings["data_shard"] = time.time() - spawned  # while the training process imports TensorFlow
        process = starting.ready()
        link.event(_written_event(written))
        port = process.receive(protocol.PORT, timeout=settings.STARTUP_TIMEOUT)["port"]
        timings["worker_start"] = time.time() - spawned
        link.event(f"training process ready on port {port}")
        fetched = fetching.wait(index, host)
        if fetched["bytes"]:
            timings["files_fetched"] = time.time() - started
            link.event(f"{fetched['bytes'] / 2**20:.1f} MB of job files fetched via {fetched['via']} in "
                       f"{fetched['seconds']:.2f} s")
        peers, how = _meet(context, link, {"host": host, "port": port, **counts}, job.attempt, timings)
        job.check_peers(peers)
        agreed = job.agree_steps(peers)
        process.send(protocol.CONFIG, tf_config=rendezvous.tf_config(peers, index), workdir=workdir, shard=shard,
                     workers_on_host=sum(peer["host"] == host for peer in peers), **counts, **agreed)
        report = _until_done(process, job, link, workdir, peers, index, host)
        process.stop(grace=settings.EXIT_GRACE)
    if job.spare_idle_timeout and not starting.warm:  # a keeper served it: there is one
        spares.leave(python, env, idle_timeout=job.spare_idle_timeout)
    files, sent = _send_back(report, link, workdir, index)
    written = dict(written)
    return WorkerResult(
        report, index=index, host=host, executor=context.getTaskInfos()[index].address, port=port,
        rows=written.pop("rows"), written=written, agreed=agreed, environment=environment_info,
        warm_start=starting.warm, rendezvous_via=how, task_started_at=started, timings={**report.timings, **timings}, files=files,
        transfer={"via": fetched["via"], "fetched_bytes": fetched["bytes"], "fetch_seconds": fetched["seconds"], **sent,
                  "encryption": link.encryption or "none"},
    )


def barrier_function(job):
    """The function handed to ``mapInArrow(..., barrier=True)``: the task's WorkerResult, in rows of
    protocol.RESULT_SCHEMA. Its failure carries the tfbarrier error (errors.encode) to the driver."""

    def run_task(batches):
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        index = context.partitionId()
        workdirs.sweep()  # what killed tasks and processes left on this host
        workdir = workdirs.make(f"tfbarrier-{job.job_id}-{index}-")
        link = driver_link.DriverLink(job.link, index)
        try:
            result = _run(job, context, batches, workdir, link)
        except TfBarrierError as exc:
            raise RuntimeError(errors.encode(exc)) from None
        except Exception as exc:
            error = WorkerError(f"task {index} failed: {type(exc).__name__}: {exc}", worker=index,
                                exc_type=type(exc).__name__)
            raise RuntimeError(errors.encode(error)) from exc
        finally:
            link.close()
            shutil.rmtree(workdir, ignore_errors=True)
        yield from protocol.result_batches(index, result)

    return run_task
