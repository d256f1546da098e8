"""The two processes of sparklyr_bench.py, the stand-ins for sparklyr's driver JVM (the owner) and for
the R session (the R side), and Child, the benchmark's handle on one: this module run as

    python bench/sparklyr_child.py --role owner|r-side

reads one JSON command a line on stdin and answers each with one "ANSWER {json}" line; Child starts it,
sends the commands and reads the answers. sparklyr_bench.py's docstring says what each side does.
"""

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = [f"x{i}" for i in range(8)]
WEIGHTS = [1.0, -2.0, 1.5, 0.5, -1.0, 2.0, -0.5, 1.0]  # the label's linear rule
STARTUP_SECONDS = 600
PHASE_SECONDS = 3600


# ---------------------------------------------------------------------------------------------------
# The two processes (this module run with --role owner / --role r-side): one JSON command a line on stdin,
# one "ANSWER {json}" line on the protocol channel (the process's original stdout; everything else that
# would print there, the JVM's output included, goes to stderr, a log file).


def _child_setup():
    import ctypes

    try:  # die with this benchmark's main process (the finally blocks below still run: SIGTERM)
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the JVM pyspark starts inherits fd 1: keep its output off the protocol
    sys.stdout = sys.stderr

    def say(payload):
        channel.write("ANSWER " + json.dumps(payload) + "\n")
        channel.flush()

    return say


def _session(name, driver_memory):
    """A local[2] SparkSession as tf_spark_connect() makes one (and as the owner's stands in for sparklyr's)."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName(name)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.memory", driver_memory)
             .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _table(spark, rows):
    """The user's table: 8 numeric columns, an integer label from a linear rule, and their vector column;
    deterministic (rand(seed) over a range of fixed partitions)."""
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    base = spark.range(rows, numPartitions=2).select(*[F.rand(seed=i).alias(c) for i, c in enumerate(COLUMNS)])
    score = sum(w * (F.col(c) - 0.5) for w, c in zip(WEIGHTS, COLUMNS))
    frame = base.withColumn("label", (score > 0).cast("int"))
    return VectorAssembler(inputCols=COLUMNS, outputCol="features").transform(frame)


def _owner(say):
    config = json.loads(sys.stdin.readline())
    spark = _session("sparklyr-owner", config["driver_memory"])
    server = None
    try:
        table = _table(spark, config["rows"]).cache()
        say({"rows": table.count(), "app_id": spark.sparkContext.applicationId})
        for line in sys.stdin:
            command = json.loads(line)
            op = command["op"]
            if op == "quit":
                break
            if op == "serve":  # tf_spark_session(sc) and sdf_register(tbl, name)
                started = time.perf_counter()
                jvm = spark.sparkContext._jvm
                server = jvm.org.apache.spark.api.python.Py4JServer(spark.sparkContext._jsc.sc().getConf())
                server.start()
                answer = {"port": server.getListeningPort(), "secret": server.secret(),
                          "pin_thread": "ClientServer" in server.server().getClass().getName(),
                          "server_seconds": time.perf_counter() - started}
                table.createOrReplaceTempView(command["view"])
                say(answer)
            elif op == "write":  # spark_write_parquet(tbl, path)
                table.write.mode("overwrite").parquet(command["path"])
                say({})
            elif op == "aggregate":  # dplyr::tbl(sc, view), or spark_read_parquet(memory = FALSE); count()
                scored = spark.table(command["view"]) if "view" in command else spark.read.parquet(command["path"])
                groups = scored.groupBy("label", "prediction").count().collect()
                say({"groups": [[row["label"], row["prediction"], row["count"]] for row in groups]})
    finally:
        if server is not None:
            server.shutdown()
        spark.stop()


def _model():
    import keras

    mlp = keras.Sequential([keras.Input((len(COLUMNS),)), keras.layers.Dense(16, activation="relu"),
                            keras.layers.Dense(2)])
    mlp.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return mlp


def _r_side(say):
    config = json.loads(sys.stdin.readline())
    import keras  # noqa: F401 - an R session that builds a Keras model has imported it
    import pyspark.sql  # noqa: F401

    import tfbarrier
    from tfbarrier.frames import vectors_as_arrays

    say({})
    spark = frame = result = None
    try:
        for line in sys.stdin:
            command = json.loads(line)
            op = command["op"]
            if op == "quit":
                break
            if op == "attach":  # tf_spark_session(sc), then spark$table(name)
                started = time.perf_counter()
                spark = tfbarrier.attach(command["port"], command["secret"], pin_thread=command["pin_thread"],
                                         embedded=True)
                attached = time.perf_counter() - started
                frame = spark.table(command["view"])
                say({"session_seconds": attached, "app_id": spark.sparkContext.applicationId})
            elif op == "connect":  # tf_spark_connect(): a second application
                started = time.perf_counter()
                spark = _session("tfbarrier", config["driver_memory"])
                say({"session_seconds": time.perf_counter() - started, "app_id": spark.sparkContext.applicationId})
            elif op == "read":  # core$frames$vectors_as_arrays(spark$read$parquet(path))
                frame = vectors_as_arrays(spark.read.parquet(command["path"]))
                say({})
            elif op == "fit":
                result = tfbarrier.fit(frame, _model(), features="features", label="label", epochs=2,
                                       batch_size=1024, num_workers=2, verbose=0)
                say({"rows": sum(worker["rows"] for worker in result.workers),
                     "epochs": len(result.history["loss"]), "loss": result.history["loss"][-1]})
            elif op == "predict":
                scored = tfbarrier.predict(frame, result, features="features")
                if "view" in command:  # back_to_sparklyr, attached: a view of the owner's application
                    scored.createOrReplaceTempView(command["view"])
                else:  # back_to_sparklyr, another application: Parquet, vector columns as arrays
                    vectors_as_arrays(scored).write.mode("overwrite").parquet(command["path"])
                say({})
    finally:
        if tfbarrier.attached_session() is not None:
            tfbarrier.detach()  # leaves the owner's SparkContext running: the owner stops it
        elif spark is not None:
            spark.stop()


# ---------------------------------------------------------------------------------------------------
# The main process's end: a child started, asked and stopped.


class Child:
    """This module running as ``role``, its stderr in ``log``; ``ask(**command)`` returns its answer."""

    def __init__(self, role, config, env, log):
        self.role, self.log = role, log
        with open(log, "w") as err:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                                         cwd=ROOT, start_new_session=True)
        self.buffer = b""
        self.ready = self._send(config, STARTUP_SECONDS)

    def _send(self, command, seconds):
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        self.proc.stdin.flush()
        return self._answer(seconds, command.get("op", "start"))

    def _answer(self, seconds, what):
        deadline = time.monotonic() + seconds
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                if line.startswith(b"ANSWER "):
                    return json.loads(line[7:])
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError(f"the {self.role} process did not answer {what!r} within {seconds} s\n"
                                   + self.tail())
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the {self.role} process exited with {self.proc.wait()} during {what!r}\n"
                                   + self.tail())
            self.buffer += chunk

    def ask(self, **command):
        return self._send(command, PHASE_SECONDS)

    def tail(self, chars=4000):
        with open(self.log, errors="replace") as f:
            return f"--- {self.role}'s stderr (last {chars} characters) ---\n" + f.read()[-chars:]

    def jvms(self):
        """PIDs of the Spark driver JVMs under this process."""
        import psutil

        found = set()
        try:
            for proc in psutil.Process(self.proc.pid).children(recursive=True):
                try:
                    if "org.apache.spark.deploy.SparkSubmit" in proc.cmdline():
                        found.add(proc.pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
        except psutil.NoSuchProcess:
            pass
        return found

    def stop(self, seconds=60):
        """Ask it to quit (it stops its Spark), then end its process group if it has not."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.stdin.write(b'{"op": "quit"}\n')
                self.proc.stdin.close()
                self.proc.wait(seconds)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.proc.wait()


def main():
    parser = argparse.ArgumentParser(description="One of sparklyr_bench.py's two processes (it starts them).")
    parser.add_argument("--role", choices=("owner", "r-side"), required=True)
    args = parser.parse_args()
    say = _child_setup()
    (_owner if args.role == "owner" else _r_side)(say)


if __name__ == "__main__":
    main()
