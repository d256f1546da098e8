"""The barrier stage seen from the driver: open the driver link its tasks report to, meet through and
fetch the job's files from, submit the stage, cancel it at the deadline, turn its failure back into a
tfbarrier error, and resubmit it after a retryable failure (with the job's files inside it, through
Spark, when the tasks could not reach the link; after a lost worker, once the cluster has room for the
job again). What a failure means and whether to run again are faults.py's rules; here is what carries
them out.

Spark never retries a failed barrier stage, so every retry is a new job submitted from here. The
job runs in a helper thread in a job group of its own, so that the driver can cancel it when
``timeout`` is reached; interrupted tasks take their training processes with them.
"""

import dataclasses
import pickle
import threading
import time

from tfbarrier import faults, progress
from tfbarrier.errors import ClusterError, JobTimeoutError, TfBarrierError, WorkerLostError
from tfbarrier.settings import CANCEL_GRACE, REPLACEMENT_WAIT, SPARK_POLL
from tfbarrier.spark import cluster, driver_link, protocol, rendezvous, task, transfer


def _text(exc):
    """The exception's message; a Py4J error whose JVM side cannot be asked any more has none."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - what Python itself shows as <exception str() failed>
        return ""


def _hosts_gone(spark, executors):
    """The hosts of ``executors`` (cluster.executor_hosts before the job) Spark has no executor on now."""
    now = cluster.executor_hosts(spark)
    return executors - now if executors is not None and now is not None else set()


def _failure(exc, spark, tag, executors, hosts):
    """What a failed job means (faults.job_failure, else Spark's own exception), once its tasks ended. A
    worker whose collective aborted for want of a peer while Spark lost another's executor
    (``executors``: the hosts Spark had executors on before the job, ``hosts``: {worker: host} from the
    rendezvous) makes that worker's WorkerLostError (faults.blame_lost_executor). Tasks on a lost host
    are not waited for: Spark cannot reach them, and their training processes stop by themselves when
    their peers stop answering."""
    lost_hosts = _hosts_gone(spark, executors)
    failure = faults.JobFailure(_text(exc), lambda: cluster.context_alive(spark), hosts or {}, frozenset(lost_hosts))
    error = faults.job_failure(failure) or exc
    unreachable = lost_hosts | ({error.host} if isinstance(error, WorkerLostError) and error.host else set())
    cluster.wait_until_tasks_end(spark, tag, CANCEL_GRACE, lost_hosts=unreachable)
    if faults.lost_contact(error):  # again: Spark may have given an executor up meanwhile
        return faults.blame_lost_executor(error, _hosts_gone(spark, executors), hosts or {})
    return error


def run(frame, job, num_workers, files, verbose=1, global_batch=None, max_retries=0, timeout=None, on_progress=None):
    """Run ``job``'s barrier stage over ``frame`` (``num_workers`` partitions) until it succeeds or
    fails for good, with the driver link open: the tasks' rendezvous, their progress, shown as
    ``verbose`` says and handed to ``on_progress`` (the chief's: experiment tracking), and ``files``
    (the job's transfer.JobFiles). Returns (WorkerResults in worker order, attempts, the tasks' messages)."""
    display = progress.ProgressDisplay(verbose, global_batch, on_progress=on_progress)
    meeting = rendezvous.DriverRendezvous(num_workers)
    server = _open_link(frame.sparkSession, display, meeting, files, job.tls)
    if server is None:
        job = transfer.with_payloads_inline(job, files)
    # the key goes only where a training process listens for its ring (a fit over the ring): the rest only connect
    tls = job.tls.pinned() if job.tls is not None and job.tensorflow_server else job.tls
    job = dataclasses.replace(job, link=server and server.endpoint, verbose=verbose, tls=tls)
    try:
        results, attempts = submit_with_retries(frame, job, files, display, max_retries=max_retries, timeout=timeout,
                                                num_workers=num_workers, meeting=meeting, link=server)
    finally:
        meeting.close()
        if server is not None:
            server.close()
        display.close(server)
    return results, attempts, server.events if server is not None else []


def _open_link(spark, display, meeting, files, tls):
    """The DriverServer of the job (over TLS with ``tls``), or None when spark.tfbarrier.driverLink is
    false or the driver cannot listen on its address (a remote Connect session)."""
    if not cluster.driver_link_enabled(spark):
        return None
    host = cluster.driver_host(spark)
    try:
        return driver_link.DriverServer(host, on_message=display.show, requests={rendezvous.REQUEST: meeting.answer},
                                        files=files, tls=tls)
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


def _wait_for_slots(spark, num_workers, error, deadline, attempts):
    """Before a job runs again after ``error`` (a WorkerLostError), wait up to REPLACEMENT_WAIT s (and not
    past ``deadline``) until Spark counts no task on the lost host as running (it cannot stop one there
    until its link is back or it gives the executor up) and the cluster has ``num_workers`` slots (a new
    executor for a lost one); else a ClusterError. Submitted before, a barrier job that does not fit
    would wait for slots with no end. The ClusterError carries ``attempts``."""
    wait = REPLACEMENT_WAIT if deadline is None else max(0.0, min(REPLACEMENT_WAIT, deadline - time.time()))
    until = time.monotonic() + wait
    lost = {error.host} if error.host else set()
    while cluster.tasks_running_on(spark, lost) and time.monotonic() < until:
        time.sleep(SPARK_POLL)
    try:
        if cluster.tasks_running_on(spark, lost):
            raise ClusterError(f"Spark still counts a task on {error.host} as running, on an executor it cannot "
                               "reach to stop it")
        cluster.check_barrier_capacity(spark, num_workers, wait=max(0.0, until - time.monotonic()))
    except ClusterError as short:
        refused = ClusterError(f"the job cannot run again after losing {error.host or 'a worker'}: within {wait:.0f} s "
                               f"no executor replaced it. {short}")
        refused.attempts = attempts
        raise refused from error


def submit_with_retries(frame, job, files, display, max_retries=0, timeout=None, num_workers=None, meeting=None,
                        link=None):
    """``submit`` until it succeeds or faults.RetryPolicy gives up (after a lost worker, once the cluster
    has ``num_workers`` slots again). Returns (results, attempts): one dict per attempt. ``link``: the job's
    DriverServer, whose refused strangers a job sent again through Spark names."""
    deadline = None if timeout is None else job.started_at + timeout
    attempts, policy = [], faults.RetryPolicy(max_retries)
    while True:
        number = len(attempts) + 1
        try:
            results, carried = submit(frame, dataclasses.replace(job, attempt=number), deadline, meeting)
        except TfBarrierError as error:
            attempts.append({"attempt": number, "error": _summary(error), "retryable": getattr(error, "retryable", False)})
            error.attempts = attempts
            step = policy.next(error, transfer.all_inline(job))
            if step is faults.Next.RAISE:
                raise
            if step is faults.Next.RESEND_THROUGH_SPARK:
                strangers = link.room.describe() if link is not None else ""
                display.unavailable(f"{str(error).splitlines()[0]}; the job runs again with its files inside it, "
                                    "through Spark" + (f" (the link refused connections that never proved the job's "
                                                       f"token: {strangers})" if strangers else ""))
                job = transfer.with_payloads_inline(job, files)
            elif step is faults.Next.RETRY_WHEN_SLOTS and num_workers:
                _wait_for_slots(frame.sparkSession, num_workers, error, deadline, attempts)
            continue
        attempts.append({"attempt": number, "error": None, "through_spark": carried, **job.attempt_fields(results)})
        return results, attempts
