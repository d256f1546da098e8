"""Driver program for test_host_faults and bench/faults_bench.py: the faults of a real network, on a
support.hosts cluster of two hosts, from a driver bound to the bridge's address. argv[1] is a JSON
object: url (the master), driver (the bridge's address), hosts (their addresses), namespaces (theirs),
dir (a directory every host sees), requests (the directory the test's hosts.Operator serves) and
scenarios (names of SCENARIOS, in order; a name may repeat). Prints one JSON line: a list of each
scenario's outcome (its error, or what it measured).

The faults are asked for by a training process at a chosen step (faults.control_at_step: worker 0
asks for a control on worker 1's host) or by this program between fits (hosts.request); the test's
Operator runs them at once, and its answers carry the time each fault happened."""

import functools
import json
import os
import sys
import tempfile
import time
import traceback
import warnings

import cloudpickle
from conftest import _is_spare, digits_cnn, digits_frames, make_spark, process_kind
from support import faults, hosts
from support.hosts import request

import tfbarrier
from tfbarrier.spark import cluster as tfb_cluster
from tfbarrier import settings
from tfbarrier.spark import stage as tfb_stage
from tfbarrier.progress import ProgressUnavailableWarning

config = json.loads(sys.argv[1])
HOSTS = config["hosts"]
# The fault callbacks run in the training processes, which cannot import the tests' modules.
cloudpickle.register_pickle_by_value(faults)
cloudpickle.register_pickle_by_value(hosts)
spark = make_spark(config["url"], **{
    "spark.driver.host": config["driver"], "spark.driver.bindAddress": config["driver"],
    "spark.executor.memory": "768m", "spark.pyspark.python": sys.executable})
FIT = {"features": "pixels", "label": "digit", "batch_size": 32, "num_workers": len(HOSTS), "verbose": 0}
train, _ = digits_frames()
# Without a shuffle: a partition lost with its host is rebuilt with its rows in the same order, so the fit resumed
# on it and the uninterrupted fit after it see the data the first attempt saw (a repartition's rebuilt partition
# came back in another order, and the uninterrupted fit's loss differed by 9%).
df = spark.createDataFrame(train).coalesce(len(HOSTS)).cache()
assert df.rdd.getNumPartitions() == len(HOSTS), df.rdd.getNumPartitions()
df.count()
SLOW_STEP = 0.2  # seconds each step of a faulted fit takes at least: the fault lands mid-epoch
STALL_TIMEOUT = 5  # slow_link's: far shorter than its fit
REPLACEMENT_WAIT = 8.0  # cut_link_retried's wait for a replacement executor (settings.REPLACEMENT_WAIT)
SPARK_TEXTS = []  # what Spark said of each failed job, as the driver read it (stage._text)
_read = tfb_stage._text
tfb_stage._text = lambda exc: SPARK_TEXTS.append(_read(exc)) or SPARK_TEXTS[-1]


def executors():
    """The executors' hosts (the driver left out)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return sorted(e.host() for e in infos if e.host() != config["driver"])


def wait_for(condition, seconds=120):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def ask(control, host, *args):
    """Run a control of the cluster now (through the test's Operator); the time it happened."""
    done = hosts.request(config["requests"], control, host, *args)
    assert "error" not in done, done
    return done["started"]


def asking(*controls):
    """What a fault callback calls with the host of worker 1: ask for each control on it, without waiting."""
    return functools.partial(_ask_each, config["requests"], controls)


def _ask_each(directory, controls, host):
    for control in controls:
        request(directory, control, host, wait=0)


def fault_time(control):
    """When the last fault named ``control`` happened, and on which host."""
    done = [a for a in hosts.answered(config["requests"]) if a["control"] == control]
    return done[-1]["started"], done[-1]["host"]


def job_processes():
    """{host: pids} of the training processes on each host that are not idle spares: a job's."""
    found = {}
    for address, namespace in zip(HOSTS, config["namespaces"]):
        pids = []
        for pid in hosts.namespace_pids(namespace):
            if process_kind(pid) == "training" and not _is_spare(pid):
                pids.append(pid)
        found[address] = pids
    return found


def left_behind(seconds=30):
    """The job processes at once, and how long until none was left on any host (None: still some)."""
    at_once, started = job_processes(), time.monotonic()
    gone = wait_for(lambda: not any(job_processes().values()), seconds)
    return {"at_once": at_once, "gone_after": round(time.monotonic() - started, 1) if gone else None,
            "after": job_processes()}


def _spark_summary(text):
    """The lines of Spark's failure text that say which task failed and why (its stacks left out)."""
    return [line.strip()[:400] for line in text.splitlines()
            if "stage failure" in line or "barrier" in line or "Lost task" in line or "ExecutorLost" in line][:6]


def failed_fit(control, worker=0, target=1, **fit_args):
    """A fit in which ``worker`` asks for ``control`` on the host of worker ``target`` at epoch 0, step 3;
    the error it raised, when, and what it left."""
    args = dict(FIT, epochs=2, steps_per_execution=1)
    args.update(fit_args)
    callbacks = [faults.slow_steps(SLOW_STEP),
                 faults.control_at_step(asking(control), epoch=0, step=3, worker=worker, target=target)]
    started, texts = time.time(), len(SPARK_TEXTS)
    try:
        tfbarrier.fit(df, digits_cnn(), callbacks=lambda: [c for f in callbacks for c in f()], **args)
    except Exception as exc:  # noqa: BLE001 - what the caller gets is the outcome
        raised_at = time.time()
        fault_at, host = fault_time(control)
        cause = exc.__cause__
        return {"class": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                "cause": cause and {"class": type(cause).__name__, "host": getattr(cause, "host", None),
                                    "retryable": getattr(cause, "retryable", None)},
                "retryable": getattr(exc, "retryable", None), "host": getattr(exc, "host", None),
                "worker": getattr(exc, "worker", None), "exc_type": getattr(exc, "exc_type", None),
                "message": str(exc)[:6000], "log": getattr(exc, "log", "")[-3000:],
                "attempts": getattr(exc, "attempts", None), "faulted_host": host,
                "seconds": round(raised_at - fault_at, 2), "fit_seconds": round(raised_at - started, 1),
                "spark": [_spark_summary(text) for text in SPARK_TEXTS[texts:]],
                "left": left_behind()}
    return {"error": "the fit succeeded despite the fault"}


def cut_link():
    """The link of worker 1's host goes down mid-epoch; it comes back once the error is in."""
    outcome = failed_fit("cut")
    outcome["restored_at"] = ask("restore", outcome["faulted_host"])
    return outcome


def cut_link_retried():
    """The link of worker 1's host goes down and stays down, with max_retries: the job cannot run again
    (Spark still counts the task there as running), which a ClusterError says once the wait for a
    replacement, shortened here to REPLACEMENT_WAIT, is over. The link comes back after."""
    tfb_stage.REPLACEMENT_WAIT = REPLACEMENT_WAIT
    try:
        outcome = failed_fit("cut", max_retries=1)
    finally:
        tfb_stage.REPLACEMENT_WAIT = settings.REPLACEMENT_WAIT
    outcome["restored_at"] = ask("restore", outcome["faulted_host"])
    outcome["replacement_wait"] = REPLACEMENT_WAIT
    return outcome


def cut_chief_link():
    """The link of the chief's host (worker 0, which runs TensorFlow's coordination service) goes down."""
    outcome = failed_fit("cut", worker=1, target=0)
    outcome["restored_at"] = ask("restore", outcome["faulted_host"])
    return outcome


def lost_host():
    """Host 1 is killed (its worker, executor, tasks and training processes) mid-epoch, no retries; then a
    new worker starts there."""
    outcome = failed_fit("stop_host")
    ask("start_host", outcome["faulted_host"])
    outcome["executors_back"] = wait_for(lambda: len(executors()) == len(HOSTS))
    return outcome


def seeded_fit(**fit_args):
    """A fit that trains the same every time: the same initial weights (the model object brings them) and
    the same order of the data (seed); every step within 2 epochs of 10."""
    import keras

    keras.utils.set_random_seed(1)
    return tfbarrier.fit(df, digits_cnn(), epochs=2, steps_per_epoch=10, steps_per_execution=1, seed=7,
                         **dict(FIT, **fit_args))


def lost_host_resumes():
    """Host 1 is killed mid-epoch 1 and a new worker starts there at once: with max_retries and
    checkpoint_dir the fit runs again (once the new executor registered) and resumes. A callback notes
    the steps each attempt ran on each worker; then the same fit runs uninterrupted, for its weights."""
    checkpoints = os.path.join(config["dir"], "checkpoints")
    ran = tempfile.mkdtemp(prefix="steps-ran-", dir=config["dir"])  # this scenario's own: bench runs it again
    callbacks = [faults.record_steps(ran), faults.slow_steps(SLOW_STEP),
                 faults.control_at_step(asking("stop_host", "start_host"), epoch=1, step=3)]
    result = seeded_fit(max_retries=1, checkpoint_dir=checkpoints, checkpoint_every=2,
                        callbacks=lambda: [c for f in callbacks for c in f()])
    outcome = {"history": result.history, "attempts": result.attempts,
               "hosts": sorted(w["host"] for w in result.workers), "steps": [w["steps"] for w in result.workers],
               "faulted_host": fault_time("stop_host")[1], "left": left_behind(),
               "ran": [{"attempt": attempt, "worker": worker, "steps": steps}
                       for (attempt, worker), steps in sorted(faults.recorded_steps(ran).items())],
               "weights": [w.tolist() for w in result.model.get_weights()]}
    uninterrupted = seeded_fit()
    outcome["uninterrupted"] = {"history": uninterrupted.history,
                                "weights": [w.tolist() for w in uninterrupted.model.get_weights()]}
    return outcome


def steady_fit(**fit_args):
    """A short fit: its workers' hosts, attempts, and the chief's seconds per step from its progress."""
    result = tfbarrier.fit(df, digits_cnn(), epochs=3, steps_per_epoch=20, **dict(FIT, **fit_args))
    progress = [(m["received_at"], m["steps"]) for m in result.progress
                if m.get("kind") == "progress" and m.get("worker") == 0 and m.get("steps")]
    gaps = [b[0] - a[0] for a, b in zip(progress, progress[1:])]
    return {"hosts": sorted(w["host"] for w in result.workers), "attempts": len(result.attempts),
            "transfer_via": [w["transfer"]["via"] for w in result.workers], "progress_messages": len(progress),
            "longest_silence": max(gaps, default=None),
            "training_seconds": progress[-1][0] - progress[0][0] if progress else None,
            "seconds_per_step": (progress[-1][0] - progress[0][0]) / (progress[-1][1] - progress[0][1])
            if len(progress) > 1 and progress[-1][1] > progress[0][1] else None}


def fit_after_restore():
    """The next fit on the cluster whose link was cut and came back."""
    return steady_fit()


def unreachable_link():
    """The driver's link listens where no host has a route to (the driver's loopback): the job runs again with
    its files inside it, the tasks meet through allGather, and the user is warned."""
    original = tfb_cluster.driver_host
    tfb_cluster.driver_host = lambda spark: "127.0.0.1"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = tfbarrier.fit(df, digits_cnn(), epochs=1, steps_per_epoch=5, **dict(FIT, verbose=1))
    finally:
        tfb_cluster.driver_host = original
    return {"hosts": sorted(w["host"] for w in result.workers), "attempts": result.attempts,
            "transfer_via": [w["transfer"]["via"] for w in result.workers], "messages": len(result.progress),
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught
                         if issubclass(w.category, ProgressUnavailableWarning)]}


def slow_link():
    """Host 1's link shaped to a few Mbit/s both ways: every all-reduce crosses it."""
    host = HOSTS[1]
    ask("shape", host, "2mbit")
    try:
        return steady_fit(stall_timeout=STALL_TIMEOUT)
    finally:
        ask("shape", host, None)


SCENARIOS = {f.__name__: f for f in (cut_link, cut_link_retried, cut_chief_link, fit_after_restore, lost_host,
                                     lost_host_resumes, unreachable_link, slow_link)}
outcomes = []
if not wait_for(lambda: len(executors()) == len(HOSTS)):
    outcomes.append({"error": f"executors: {executors()}"})
for name in config["scenarios"]:
    started = time.monotonic()
    try:
        outcome = SCENARIOS[name]()
    except Exception as exc:  # reported to the test
        outcome = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
    outcome.update(scenario=name, scenario_seconds=round(time.monotonic() - started, 1))
    outcomes.append(outcome)
    print(f"{name}: {json.dumps(outcome, default=str)[:300]}", file=sys.stderr, flush=True)
print("RESULT " + json.dumps(outcomes, default=str))
sys.stdout.flush()
spark.stop()
