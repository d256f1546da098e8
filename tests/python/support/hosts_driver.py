"""Driver program for test_hosts: everything tfbarrier does, on a support.hosts cluster of several
hosts (network namespaces), from a driver bound to the bridge's address. argv[1] is a JSON object:
url (the master), driver (the bridge's address), hosts (their addresses), dir (a directory every host
sees), tag (the test session's, which the cluster's processes carry), run_id (the cluster's), host_tmp
(each host's TMPDIR), model_loads (each host's predict model-load log), namespaces (the hosts'),
impostor (the file that makes host 1 an impostor: support/impostor) and scenarios: "two" (fit with
validation_data, save_to and checkpoint_dir; a second fit, warm; predict; run; apply; tune; a PythonEnv
twice; a stranger during fits; an impostor host) or "three" (one fit). Prints one JSON line: each
scenario's outcome, or its error."""

import json
import os
import sys
import threading
import time
import traceback

import numpy as np
from conftest import digits_cnn, digits_frames, held_out_accuracy, make_spark, meet_in_pairs, training_processes
from support import stranger
from support.hosts import run_processes
from test_environments import write_wheel

import tfbarrier
from tfbarrier.spark import environment, workdirs
from tfbarrier.spark.environment import PythonEnv

config = json.loads(sys.argv[1])
HOSTS = len(config["hosts"])
spark = make_spark(config["url"], **{
    "spark.driver.host": config["driver"], "spark.driver.bindAddress": config["driver"],
    "spark.executor.memory": "768m", "spark.pyspark.python": sys.executable})
FIT = {"features": "pixels", "label": "digit", "batch_size": 16 * HOSTS, "num_workers": HOSTS, "verbose": 0}
train, held_out = digits_frames()
df = spark.createDataFrame(train).repartition(HOSTS).cache()
df.count()
outcomes = {}


def wait_for(condition, seconds=90):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def executors():
    """The executors' hosts (the driver left out)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return sorted(e.host() for e in infos if e.host() != config["driver"])


def workers(result, *keys):
    return [{k: w[k] for k in ("index", "host", "executor", "checksum", "warm_start", *keys)} for w in result.workers]


def keepers():
    """The cluster's keepers of warm start: its processes carry the test session's tag (this program's
    differs) and the run's marker (the test session's local Spark may have keepers too)."""
    return sorted(set(training_processes(tag=config["tag"], kind="keeper")) & set(run_processes(config["run_id"])))


def fit_with_validation_saving_and_checkpoints():
    saved, checkpoints = os.path.join(config["dir"], "saved"), os.path.join(config["dir"], "checkpoints")
    result = tfbarrier.fit(df, digits_cnn(), epochs=2, validation_data=spark.createDataFrame(held_out), save_to=saved,
                           checkpoint_dir=checkpoints, seed=1, **FIT)
    outcomes["model"] = result.model
    return {"workers": workers(result, "rows", "validation_rows", "checkpoint_saves", "transfer"),
            "rendezvous": [m["event"] for m in result.progress if str(m.get("event", "")).startswith("rendezvous")],
            "history": result.history, "accuracy": held_out_accuracy(result.model, held_out),
            "saved": [{"epoch": s["epoch"], "bytes": os.path.getsize(s["path"])} for s in result.saved],
            "checkpoint_files": sorted(os.listdir(checkpoints)) if os.path.isdir(checkpoints) else None,
            "attempts": len(result.attempts)}


def second_fit():
    kept = wait_for(lambda: len(keepers()) >= HOSTS)  # one per executor
    result = tfbarrier.fit(df, digits_cnn(), epochs=1, steps_per_epoch=5, **FIT)
    return {"keepers_before": kept, "workers": workers(result)}


def predict():
    frame = held_out.assign(id=np.arange(len(held_out)))
    scored = tfbarrier.predict(spark.createDataFrame(frame).repartition(HOSTS), outcomes["model"], features="pixels")
    rows = sorted(scored.select("id", "prediction").collect())
    x = np.stack(frame["pixels"].to_numpy()).reshape(-1, 8, 8, 1).astype("float32")
    local = np.argmax(outcomes["model"].predict(x, verbose=0), axis=1)
    loads = []
    for path in config["model_loads"]:
        loads.append(len(open(path).read().splitlines()) if os.path.exists(path) else 0)
    return {"rows": len(rows), "equal_to_local": int(np.sum([r["prediction"] for r in rows] == local)),
            "model_loads": loads}


def all_reduce():
    """A collective across the workers' hosts, in a function of the user's (run)."""
    import json
    import os

    import tensorflow as tf

    tf_config = json.loads(os.environ["TF_CONFIG"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    value = strategy.run(lambda: tf.constant(float(tf_config["task"]["index"] + 1)))
    return {"workers": tf_config["cluster"]["worker"], "sum": float(strategy.reduce("SUM", value, axis=None))}


def run():
    return tfbarrier.run(all_reduce, num_workers=HOSTS, verbose=0)


def describe(partition, barrier):
    import pandas as pd

    workers = json.loads(barrier["tf_config"])["cluster"]["worker"]
    return pd.DataFrame({"partition": [barrier["partition"]], "address": [barrier["address"]],
                         "rows": [len(partition)], "workers": [",".join(workers)]})


def apply():
    out = tfbarrier.apply(df, describe, num_workers=HOSTS, verbose=0)
    return out.to_dict("list")


def record_host(directory):
    """A callbacks factory: each worker writes its own TF_CONFIG address into ``directory``."""
    def factory():
        import json
        import os
        import uuid

        tf_config = json.loads(os.environ["TF_CONFIG"])
        with open(os.path.join(directory, uuid.uuid4().hex), "w") as f:
            f.write(tf_config["cluster"]["worker"][tf_config["task"]["index"]])
        return []

    return factory


def tune():
    """Two one-worker trials: they train at the same time (each chief waits for the other at its end), so
    on two hosts of one slot each they run on different hosts."""
    meet, hosts = os.path.join(config["dir"], "meet"), os.path.join(config["dir"], "trial-hosts")
    os.makedirs(meet)
    os.makedirs(hosts)
    meeting, recording = meet_in_pairs(meet, pairs=1, seconds=120), record_host(hosts)

    def cnn(params):
        model = digits_cnn()
        model.optimizer.learning_rate.assign(params["learning_rate"])
        return model

    search = tfbarrier.tune(df, cnn, {"learning_rate": [0.01, 0.003]}, features="pixels", label="digit", metric="loss",
                            workers_per_trial=1, epochs=1, steps_per_epoch=5, batch_size=32, verbose=0,
                            callbacks=lambda: meeting() + recording())
    return {"status": list(search.trials["status"]), "errors": list(search.trials["error"]),
            "hosts": sorted(open(os.path.join(hosts, name)).read() for name in os.listdir(hosts))}


def import_the_probe():
    import tfbarrier_probe  # noqa: F401

    return []


def python_env():
    """A PythonEnv (the probe wheel over this Python's packages) in two fits: each host builds it once
    in its own default place (its TMPDIR), then finds it."""
    wheelhouse = os.path.join(config["dir"], "wheelhouse")
    os.makedirs(wheelhouse)
    write_wheel(wheelhouse)
    env = PythonEnv(requirements=["tfbarrier-probe==1.0"], find_links=[wheelhouse], no_index=True,
                    system_site_packages=True)
    fits = []
    for _ in range(2):
        result = tfbarrier.fit(df, digits_cnn(), epochs=1, steps_per_epoch=5, env=env, callbacks=import_the_probe,
                               **FIT)
        fits.append(workers(result, "environment", "python_prefix"))
    logs = [os.path.join(tmp, f"{workdirs.CACHE_PREFIX}{os.geteuid()}", environment.BUILD_LOG)
            for tmp in config["host_tmp"]]
    return {"fits": fits, "builds": [len(open(p).read().splitlines()) if os.path.exists(p) else 0 for p in logs]}


def run_training_processes():
    """The cluster's adopted training processes (the session's tag and the run's marker)."""
    return sorted(set(training_processes(tag=config["tag"])) & set(run_processes(config["run_id"])))


def host_of(pid):
    """The address of the host (network namespace) process ``pid`` runs in."""
    inode = os.stat(f"/proc/{pid}/ns/net").st_ino
    return next(address for address, name in zip(config["hosts"], config["namespaces"])
                if os.stat(f"/run/netns/{name}").st_ino == inode)


def held_while(path):
    """Callbacks that hold a fit after a step while the file ``path`` exists (at most 120 s), so the stranger
    finds it at work: its ring made, its processes training."""
    def callbacks():
        import os
        import time

        import tf_keras

        class HeldWhile(tf_keras.callbacks.Callback):  # Keras 3's fit takes tf_keras's callbacks too
            def on_train_batch_end(self, batch, logs=None):
                deadline = time.monotonic() + 120
                while os.path.exists(path) and time.monotonic() < deadline:
                    time.sleep(0.1)

        return [HeldWhile()]

    return callbacks


def stranger_during(exchange, marker):
    """support/stranger.py, from the driver's place on the bridge, against every port each training process
    of a fit listens on, at its host's address, while the fit trains; then the fit's outcome."""
    outcome, hold = {}, os.path.join(config["dir"], "hold")
    open(hold, "w").close()
    fit = threading.Thread(target=lambda: outcome.update(result=tfbarrier.fit(
        df, digits_cnn(), epochs=1, steps_per_epoch=5, callbacks=held_while(hold), exchange=exchange, **FIT)))
    fit.start()
    wait_for(lambda: len(run_training_processes()) == HOSTS)
    time.sleep(3.0)  # past the ring's making: the processes train
    ports = {host_of(pid): stranger.listening_ports([pid]) for pid in run_training_processes()}
    answers = [answer for host, found in ports.items() for answer in stranger.attempt(host, found, marker)]
    alive = fit.is_alive()
    os.remove(hold)
    fit.join(timeout=300)
    result = outcome.get("result")
    return {"ports": ports, "answers": answers, "alive_after": alive,
            "steps": result and [w["steps"] for w in result.workers],
            "checksums": result and [w["checksum"] for w in result.workers]}


def strangers():
    """A stranger during a fit over the ring (the default), then under MultiWorkerMirroredStrategy (exchange
    "strategy"), which shows what the stranger looks for."""
    marker = os.path.join(config["dir"], "stranger-marker.txt")
    with open(marker, "w") as f:
        f.write(config["stranger_secret"])
    return {"ring": stranger_during("auto", marker), "strategy": stranger_during("strategy", marker)}


def impostor():
    """A fit while host 1 is an impostor (support/impostor: its training process joins the ring with another
    secret): its error, the seconds it took, and the training processes left 30 s after."""
    open(config["impostor"], "w").close()
    started = time.monotonic()
    try:
        tfbarrier.fit(df, digits_cnn(), epochs=1, steps_per_epoch=5, **FIT)
        failed = {"class": None}
    except Exception as exc:  # the outcome under test
        failed = {"class": type(exc).__name__, "message": str(exc), "seconds": round(time.monotonic() - started, 1)}
    finally:
        os.remove(config["impostor"])
    wait_for(lambda: not run_training_processes(), seconds=30)
    return dict(failed, left=run_training_processes())


def three_hosts():
    result = tfbarrier.fit(df, digits_cnn(), epochs=1, **FIT)
    return {"workers": workers(result, "rows"), "loss": result.history["loss"]}


SCENARIOS = {
    "two": [fit_with_validation_saving_and_checkpoints, second_fit, predict, run, apply, tune, python_env, strangers,
            impostor],
    "three": [three_hosts],
}
outcomes["executors"] = wait_for(lambda: len(executors()) == HOSTS) and executors()
timings = {}
for scenario in SCENARIOS[config["scenarios"]]:
    started = time.monotonic()
    try:
        outcomes[scenario.__name__] = scenario()
    except Exception as exc:  # reported to the test
        outcomes[scenario.__name__] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
    timings[scenario.__name__] = round(time.monotonic() - started, 1)
outcomes.pop("model", None)
outcomes["seconds"] = timings
print("RESULT " + json.dumps(outcomes, default=str))
sys.stdout.flush()
spark.stop()
