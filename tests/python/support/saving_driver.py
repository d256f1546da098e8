"""Driver program for test_saving: a long fit with save_to on a local[2] Spark of its own, which the
test kills (SIGKILL) once the chief has saved a model. Prints its session tag first."""

import json
import sys

from conftest import SESSION_TAG, digits_cnn, digits_frames, make_spark
from support import faults

import tfbarrier

print("STARTED " + json.dumps({"tag": SESSION_TAG}), flush=True)
spark = make_spark("local[2]")
df = spark.createDataFrame(digits_frames()[0])
tfbarrier.fit(df, digits_cnn(), features="pixels", label="digit", epochs=100, batch_size=64, verbose=0,
              save_to=sys.argv[1], callbacks=faults.slow_steps(0.2))
print("RESULT " + json.dumps({"finished": True}), flush=True)  # the test kills it long before
