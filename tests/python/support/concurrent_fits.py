"""Driver program for test_concurrency: two fits at once on one local[4] Spark, from two threads.
Prints one JSON line with each fit's workers."""

import json
import threading

from conftest import digits_cnn, digits_frames, make_spark

import tfbarrier

spark = make_spark("local[4]")
df = spark.createDataFrame(digits_frames()[0]).cache()
df.count()
outcomes = {}


def train(name):
    try:
        result = tfbarrier.fit(df, digits_cnn(), features="pixels", label="digit", epochs=2, batch_size=64,
                               num_workers=2, tf_threads=1)
        outcomes[name] = {"workers": [{k: w[k] for k in ("port", "checksum", "rows")} for w in result.workers],
                          "loss": result.history["loss"]}
    except Exception as exc:  # reported to the test
        outcomes[name] = {"error": f"{type(exc).__name__}: {exc}"}


threads = [threading.Thread(target=train, args=(name,)) for name in ("a", "b")]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("RESULT " + json.dumps(outcomes))
spark.stop()
