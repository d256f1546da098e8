"""Driver program for test_concurrency, on one local[4] Spark: two fits at once from two threads (their
workers' training times, to show that they overlapped); a tune of 2-worker trials, two at a time; a tune
interrupted by Ctrl-C. Prints one JSON line with what each did."""

import json
import os
import signal
import sys
import tempfile
import threading
import time

from conftest import digits_cnn, digits_frames, make_spark, meet_in_pairs, training_processes

import tfbarrier

spark = make_spark("local[4]")
df = spark.createDataFrame(digits_frames()[0]).cache()
df.count()
outcomes = {}


def train(name, callbacks):
    try:
        result = tfbarrier.fit(df, digits_cnn(), features="pixels", label="digit", epochs=2, batch_size=64,
                               num_workers=2, tf_threads=1, callbacks=callbacks)
        outcomes[name] = {"workers": [{k: w[k] for k in ("port", "checksum", "rows", "first_step_at", "finished_at")}
                                      for w in result.workers],
                          "loss": result.history["loss"]}
    except Exception as exc:  # reported to the test
        outcomes[name] = {"error": f"{type(exc).__name__}: {exc}"}


def cnn(params):
    model = digits_cnn()
    model.optimizer.learning_rate.assign(params["learning_rate"])
    return model


def two_worker_trials():
    """Three trials of two workers each on four slots: two run at once (they meet), then the third."""
    search = tfbarrier.tune(df, cnn, {"learning_rate": [0.01, 0.003, 0.001]}, features="pixels", label="digit",
                            metric="loss", workers_per_trial=2, epochs=1, batch_size=64, verbose=0,
                            callbacks=meet_in_pairs(tempfile.mkdtemp(), pairs=1))
    return {"status": list(search.trials["status"]), "errors": list(search.trials["error"]),
            "workers": [len(search.best.workers)]}


def interrupted_tune():
    """Ctrl-C once the first trials train: tune raises KeyboardInterrupt, and no Spark job or training
    process of it is left."""
    def interrupt_once_training():
        while not training_processes():
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_training, daemon=True).start()
    try:
        tfbarrier.tune(df, cnn, {"learning_rate": [0.01, 0.003, 0.001, 0.0003]}, features="pixels", label="digit",
                       metric="loss", epochs=200, batch_size=64, verbose=0)
        raised = None
    except BaseException as exc:  # noqa: B902 - the test wants to see which
        raised = type(exc).__name__
    deadline = time.time() + 60
    while training_processes() and time.time() < deadline:
        time.sleep(0.5)
    return {"raised": raised, "processes_left": training_processes(),
            "active_jobs": list(spark.sparkContext.statusTracker().getActiveJobsIds())}


# Each chief waits at the end of its training for the other (conftest.meet_in_pairs): fits that run at once,
# however far apart they started on a busy machine, are both seen training at the same time.
both_trained = meet_in_pairs(tempfile.mkdtemp(), pairs=1, seconds=120)
threads = [threading.Thread(target=train, args=(name, both_trained)) for name in ("a", "b")]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for name, phase in (("tune", two_worker_trials), ("interrupted", interrupted_tune)):
    try:
        outcomes[name] = phase()
    except Exception as exc:  # reported to the test
        outcomes[name] = {"error": f"{type(exc).__name__}: {exc}"}
print("RESULT " + json.dumps(outcomes))
sys.stdout.flush()
spark.stop()
