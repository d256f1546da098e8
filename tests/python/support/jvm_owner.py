"""A stand-in for sparklyr's driver: a process of its own that starts Spark (``local[2]``, or the
standalone master given as its argument), starts Spark's Py4JServer in its driver JVM, registers the
8x8 digits as the temporary view ``digits`` and prints ``READY {port, secret, app_id, pin_thread}``. Then
it answers commands from stdin, one JSON line each: ``{"view": name}`` (that view's row count and
columns, as the owner's session sees it), ``{"alive": true}`` (whether its SparkContext still runs),
``{"quit": true}``. ``TFBARRIER_TEST_JVM_LIBRARY_PATH`` is the ``LD_LIBRARY_PATH`` its JVM starts with (R
puts the system's library directory there, and every process sparklyr's JVM starts inherits it).

The owner itself runs on this interpreter's own libraries: only the JVM gets that path."""

import json
import os
import sys

from conftest import digits_frames, make_spark

if os.environ.get("TFBARRIER_TEST_JVM_LIBRARY_PATH"):  # pyspark hands its environment to the JVM it launches
    os.environ["LD_LIBRARY_PATH"] = os.environ["TFBARRIER_TEST_JVM_LIBRARY_PATH"]
conf = {"spark.tfbarrier.warmStart": "false"}  # training processes are children of the executors' Python workers
spark = make_spark(sys.argv[1] if len(sys.argv) > 1 else "local[2]", **conf)
train, _ = digits_frames()
spark.createDataFrame(train).createOrReplaceTempView("digits")
jvm = spark.sparkContext._jvm
server = jvm.org.apache.spark.api.python.Py4JServer(spark.sparkContext._jsc.sc().getConf())
server.start()
print("READY " + json.dumps({"port": server.getListeningPort(), "secret": server.secret(),
                             "app_id": spark.sparkContext.applicationId, "master": spark.sparkContext.master,
                             "pin_thread": "ClientServer" in server.server().getClass().getName()}), flush=True)
for line in sys.stdin:
    command = json.loads(line)
    if command.get("quit"):
        break
    if "view" in command:
        frame = spark.table(command["view"])
        answer = {"rows": frame.count(), "columns": frame.columns,
                  "first": [list(row) if isinstance(row, (list, tuple)) else row
                            for row in frame.orderBy(frame.columns[0]).limit(3).toPandas().iloc[:, -1].tolist()]}
    else:
        answer = {"alive": not spark.sparkContext._jsc.sc().isStopped()}
    print("ANSWER " + json.dumps(answer, default=str), flush=True)
server.shutdown()
spark.stop()
