"""Attaches to the driver JVM of support/jvm_owner.py (its port and secret come on stdin, as JSON:
never in the environment) and trains on its view ``digits``, scores the held-out rows back into its
view ``scored`` (and waits for a line on stdin while the owner reads it: the predictions are lazy, and
with ``embedded`` the test stops this process meanwhile, as R runs no Python while it collects through
sparklyr), attaches again, stops the attached session (which only detaches) and attaches anew.
Prints one JSON line: what it saw."""

import json
import os
import sys

import psutil
from conftest import digits_cnn, digits_frames

import tfbarrier

given = json.loads(sys.stdin.readline())
outcome = {"secret_in_environ": any(given["secret"] in value for value in os.environ.values())}
spark = tfbarrier.attach(given["port"], given["secret"], pin_thread=given["pin_thread"], embedded=given["embedded"])
outcome["app_id"] = spark.sparkContext.applicationId
outcome["master"] = spark.sparkContext.master
outcome["executor_python"] = spark.sparkContext.pythonExec


def ancestors():  # in each training process: its ancestors' command lines, worker 0 writes them
    def factory():
        import tf_keras

        class Record(tf_keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
                    chain = [" ".join(p.cmdline()) for p in psutil.Process().parents()]
                    with open(given["ancestors_file"], "w") as f:
                        json.dump(chain, f)

        return [Record()]

    return factory


result = tfbarrier.fit(spark.table("digits"), digits_cnn(), features="pixels", label="digit", epochs=2,
                       batch_size=64, num_workers=2, seed=1, callbacks=ancestors(), verbose=0)
outcome["fit"] = {"rows": sum(w["rows"] for w in result.workers), "epochs": len(result.history["loss"])}
with open(given["ancestors_file"]) as f:
    outcome["training_ancestors"] = json.load(f)
_, held_out = digits_frames()
scored = tfbarrier.predict(spark.createDataFrame(held_out), result, features="pixels")
scored.createOrReplaceTempView("scored")
print("SCORED", flush=True)
sys.stdin.readline()
outcome["secret_in_environ"] |= any(given["secret"] in value for value in os.environ.values())
outcome["same_session_again"] = tfbarrier.attach(given["port"], given["secret"],
                                                 pin_thread=given["pin_thread"]) is spark
spark.stop()  # only detaches: the owner's SparkContext runs on
outcome["after_stop"] = tfbarrier.attached_session() is None
again = tfbarrier.attach(given["port"], given["secret"], pin_thread=given["pin_thread"])
outcome["reattached_rows"] = again.table("digits").count()
tfbarrier.detach()
print("RESULT " + json.dumps(outcome), flush=True)
