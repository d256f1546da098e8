"""Driver program for test_spares: fits on a local[2] Spark of its own (so that its two Python
workers are the only ones), with spare training processes on, then off. Prints one JSON line."""

import json
import time

from conftest import SESSION_TAG, digits_cnn, digits_frames, make_spark, training_processes

import tfbarrier

spark = make_spark("local[2]")
df = spark.createDataFrame(digits_frames()[0]).repartition(2).cache()
df.count()
report = {"tag": SESSION_TAG, "fits": []}


def fit():
    result = tfbarrier.fit(df, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64)
    time.sleep(1)  # the spares' interpreters start
    report["fits"].append({
        "warm": [w["warm_start"] for w in result.workers],
        "checksums": [w["checksum"] for w in result.workers],
        "tensorflow_import": [w["timings"]["tensorflow_import"] for w in result.workers],
        "spares": sorted(set(training_processes(spares=True)) - set(training_processes())),
        "busy": training_processes(),
    })


fit()
fit()
spark.conf.set("spark.tfbarrier.warmStart", "false")
fit()
print("RESULT " + json.dumps(report), flush=True)
spark.stop()
