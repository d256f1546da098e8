"""The barrier stage seen from the driver: open the driver link its tasks report to, meet through and
fetch the job's files from, submit the stage, cancel it at the deadline, turn its failure back into a
tfbarrier error (``_failure``: what a failed job means, a lost worker's host among it), and resubmit
it after a retryable failure (with the job's files inside it, through Spark, when the tasks could not
reach the link; after a lost worker, once the cluster has room for the job again).

Spark never retries a failed barrier stage, so every retry is a new job submitted from here. The
job runs in a helper thread in a job group of its own, so that the driver can cancel it when
``timeout`` is reached; interrupted tasks take their training processes with them.
"""

import dataclasses
import pickle
import re
import threading
import time

from . import cluster, driver_link, errors, progress, protocol, rendezvous, task, transfer
from .errors import ClusterError, DriverUnreachableError, JobTimeoutError, PortClashError, WorkerError, WorkerLostError
from .settings import CANCEL_GRACE, REPLACEMENT_WAIT

PORT_CLASH_ATTEMPTS = 3  # port clashes are retried on their own, outside max_retries
_LOST_TASK_SIGNS = ("ExecutorLostFailure", "Executor lost", "executor lost")


_DRIVER_MEMORY_SIGNS = ("TaskResultLost", "OutOfMemoryError", "Java heap space", "spark.driver.maxResultSize")


def _text(exc):
    """The exception's message; a Py4J error whose JVM side cannot be asked any more has none."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - what Python itself shows as <exception str() failed>
        return ""


def _lost_executor(text, hosts, lost_hosts):
    """The WorkerLostError of a job Spark failed because it lost an executor (``text``: its failure):
    the worker is the barrier task's partition, its host Spark's word, the rendezvous' (``hosts``,
    {worker: host}) or the one host whose executors are gone (``lost_hosts``)."""
    worker = re.search(r"barrier task ResultTask\(\d+, (\d+)\)|Lost task (\d+)\.\d+ in stage", text)
    worker = int(worker.group(1) or worker.group(2)) if worker else None
    host = re.search(r"Lost task \S+ in stage \S+ \(TID \d+\) \(([^\s()]+) executor [^)]*\): ExecutorLostFailure", text)
    host = host.group(1) if host else hosts.get(worker) or (next(iter(lost_hosts)) if len(lost_hosts) == 1 else None)
    reason = next((line.strip() for line in text.splitlines() if "ExecutorLostFailure" in line), "")
    reason = reason[reason.index("ExecutorLostFailure"):] if reason else "an executor was lost"
    return WorkerLostError.of(worker, host, f"Spark lost its executor ({reason})")


def _translate(exc, spark, hosts=None, lost_hosts=()):
    """The tfbarrier error a failed job carries, a ClusterError for Python workers without tfbarrier's
    packages or for a driver whose JVM failed, a WorkerLostError for a lost executor, or the original
    exception. ``hosts`` ({worker: host}) and ``lost_hosts`` (those whose executors are gone) help
    name a lost worker."""
    text = _text(exc)
    error = errors.decode(text)
    if error is not None:
        return error
    missing = cluster.missing_module_error(text)  # a Python worker without tfbarrier's packages
    if missing is not None:
        return missing
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if not cluster.context_alive(spark):
        return ClusterError(
            f"Spark's driver stopped during the job ({first or 'no message: its JVM is gone'}): the SparkContext "
            "is shut down, so start a new SparkSession. If its JVM ran out of memory, give it more "
            "(spark.driver.memory)")
    if any(sign in text for sign in _DRIVER_MEMORY_SIGNS):
        return ClusterError(
            f"Spark's driver could not hold what the job sent through it ({first}): the tasks' results, or the "
            "job's files (the model's weights) where the executors cannot reach the driver's link, pass "
            "through the driver's JVM. Give it more memory (spark.driver.memory, spark.driver.maxResultSize), "
            "or let the executors reach the driver (spark.tfbarrier.driverLink)")
    if any(sign in text for sign in _LOST_TASK_SIGNS):
        return _lost_executor(text, hosts or {}, lost_hosts)
    return exc


def _hosts_gone(spark, executors):
    """The hosts of ``executors`` (cluster.executor_hosts before the job) Spark has no executor on now."""
    now = cluster.executor_hosts(spark)
    return executors - now if executors is not None and now is not None else set()


def _failure(exc, spark, tag, executors, hosts):
    """What a failed job means, once its tasks ended: the error (``_translate``) of the first task Spark
    saw fail, unless that was a worker whose collective aborted for want of a peer (errors.lost_contact)
    while Spark lost the executor of another (``executors``: the hosts Spark had executors on before
    the job, ``hosts``: {worker: host} from the rendezvous): then that worker's WorkerLostError, with
    the aborted collective as its context. Tasks on a lost host are not waited for: Spark cannot reach
    them, and their training processes stop by themselves when their peers stop answering."""
    lost_hosts = _hosts_gone(spark, executors)
    error = _translate(exc, spark, hosts, lost_hosts)
    unreachable = lost_hosts | ({error.host} if isinstance(error, WorkerLostError) and error.host else set())
    cluster.wait_until_tasks_end(spark, tag, CANCEL_GRACE, lost_hosts=unreachable)
    if errors.lost_contact(error):
        gone = _hosts_gone(spark, executors)  # again: Spark may have given an executor up meanwhile
        if hosts:  # the job's own hosts, when the rendezvous knows them
            gone &= set(hosts.values())
        if gone:
            host = sorted(gone)[0]
            worker = min((w for w, h in hosts.items() if h == host), default=None)
            return WorkerLostError.of(worker, host, "Spark lost its executor during the job", consequence=error)
    return error


def run(frame, job, num_workers, files, verbose=1, global_batch=None, max_retries=0, timeout=None, on_progress=None):
    """Run ``job``'s barrier stage over ``frame`` (``num_workers`` partitions) until it succeeds or
    fails for good, with the driver link open: the tasks' rendezvous, their progress, shown as
    ``verbose`` says and handed to ``on_progress`` (the chief's: experiment tracking), and ``files``
    (the job's transfer.JobFiles). Returns (WorkerResults in worker order, attempts, the tasks' messages)."""
    display = progress.ProgressDisplay(verbose, global_batch, on_progress=on_progress)
    meeting = rendezvous.DriverRendezvous(num_workers)
    server = _open_link(frame.sparkSession, display, meeting, files)
    if server is None:
        job = transfer.with_payloads_inline(job, files)
    job = dataclasses.replace(job, link=server and server.endpoint, verbose=verbose)
    try:
        results, attempts = submit_with_retries(frame, job, files, display, max_retries=max_retries, timeout=timeout,
                                                num_workers=num_workers, meeting=meeting)
    finally:
        meeting.close()
        if server is not None:
            server.close()
        display.close(server)
    return results, attempts, server.events if server is not None else []


def _open_link(spark, display, meeting, files):
    """The DriverServer of the job, or None when spark.tfbarrier.driverLink is false or the driver cannot
    listen on its address (a remote Connect session)."""
    if not cluster.driver_link_enabled(spark):
        return None
    host = cluster.driver_host(spark)
    try:
        return driver_link.DriverServer(host, on_message=display.show, requests={rendezvous.REQUEST: meeting.answer},
                                        files=files)
    except OSError as exc:  # spark.driver.host is not this machine (a remote Connect session): no link
        display.unavailable(f"the driver cannot listen on {host} ({exc})")
        return None


def submit(frame, job, deadline=None, meeting=None):
    """Run the barrier stage once: (the tasks' WorkerResults in worker order, the bytes Spark carried:
    the pickled job in the task closure, the results). ``meeting`` (the DriverRendezvous) tells where
    each worker ran, should one be lost."""
    spark = frame.sparkSession
    tag = f"tfbarrier-{job.job_id}-{job.attempt}"
    outcome = {}
    executors = cluster.executor_hosts(spark)

    def collect():
        cluster.label_jobs(spark, tag)
        try:
            stage = frame.mapInArrow(task.barrier_function(job), protocol.RESULT_SCHEMA, barrier=True)
            outcome["rows"] = stage.collect()
        except BaseException as exc:  # noqa: B902 - handed to the calling thread
            outcome["error"] = exc

    collector = threading.Thread(target=collect, name=f"tfbarrier-{job.job_id}", daemon=True)
    collector.start()
    collector.join(None if deadline is None else max(0.0, deadline - time.time()))
    if collector.is_alive():
        cluster.cancel_jobs(spark, tag)
        collector.join(CANCEL_GRACE)
        cluster.wait_until_tasks_end(spark, tag, CANCEL_GRACE)
        raise JobTimeoutError(
            f"the job ran past its timeout of {deadline - job.started_at:.0f} s and was cancelled; every "
            "worker was stopped. Raise timeout=, or look for a worker that hangs (stall_timeout=)"
        )
    if "error" in outcome:
        hosts = meeting.hosts(job.attempt) if meeting is not None else {}
        raise _failure(outcome["error"], spark, tag, executors, hosts) from None
    carried = {"job_bytes": len(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)),
               "result_bytes": sum(len(row["payload"]) for row in outcome["rows"])}
    return protocol.results_from_rows(outcome["rows"]), carried


def _summary(error):
    return f"{type(error).__name__}: {str(error).splitlines()[0]}"


def _wait_for_slots(spark, num_workers, error, deadline):
    """Before a job runs again after ``error`` (a WorkerLostError), wait up to REPLACEMENT_WAIT s (and not
    past ``deadline``) until Spark counts no task on the lost host as running (it cannot stop one there
    until its link is back or it gives the executor up) and the cluster has ``num_workers`` slots (a new
    executor for a lost one); else a ClusterError. Submitted before, a barrier job that does not fit
    would wait for slots with no end."""
    wait = REPLACEMENT_WAIT if deadline is None else max(0.0, min(REPLACEMENT_WAIT, deadline - time.time()))
    until = time.monotonic() + wait
    lost = {error.host} if error.host else set()
    while cluster.tasks_running_on(spark, lost) and time.monotonic() < until:
        time.sleep(0.5)
    try:
        if cluster.tasks_running_on(spark, lost):
            raise ClusterError(f"Spark still counts a task on {error.host} as running, on an executor it cannot "
                               "reach to stop it")
        cluster.check_barrier_capacity(spark, num_workers, wait=max(0.0, until - time.monotonic()))
    except ClusterError as short:
        raise ClusterError(f"the job cannot run again after losing {error.host or 'a worker'}: within {wait:.0f} s "
                           f"no executor replaced it. {short}") from error


def submit_with_retries(frame, job, files, display, max_retries=0, timeout=None, num_workers=None, meeting=None):
    """``submit`` until it succeeds, resubmitting after retryable failures (at most ``max_retries``
    times, port clashes and an unreachable driver link aside); after a lost worker, once the cluster
    has ``num_workers`` slots again. Returns (results, attempts): one dict per attempt."""
    deadline = None if timeout is None else job.started_at + timeout
    attempts, failures, clashes = [], 0, 0
    while True:
        number = len(attempts) + 1
        try:
            results, carried = submit(frame, dataclasses.replace(job, attempt=number), deadline, meeting)
        except JobTimeoutError as error:  # one deadline for every attempt: no retry after it
            attempts.append({"attempt": number, "error": _summary(error), "retryable": False})
            error.attempts = attempts
            raise
        except WorkerError as error:
            attempts.append({"attempt": number, "error": _summary(error), "retryable": error.retryable})
            if isinstance(error, DriverUnreachableError) and not transfer.all_inline(job):
                display.unavailable(f"{str(error).splitlines()[0]}; the job runs again with its files inside it, "
                                    "through Spark")
                job = transfer.with_payloads_inline(job, files)
                continue
            if isinstance(error, PortClashError):
                clashes += 1
                if clashes < PORT_CLASH_ATTEMPTS:
                    continue
            elif error.retryable and failures < max_retries:
                failures += 1
                if isinstance(error, WorkerLostError) and num_workers:
                    try:
                        _wait_for_slots(frame.sparkSession, num_workers, error, deadline)
                    except ClusterError as short:
                        short.attempts = attempts
                        raise
                continue
            error.attempts = attempts
            raise
        attempts.append({"attempt": number, "error": None, "initial_epoch": results[0].initial_epoch,
                         "resumed_at": results[0].resumed_at, "through_spark": carried})
        return results, attempts
