"""Shared fixtures: one local[2] SparkSession for the whole test session, scikit-learn's bundled
8x8 digits as Spark DataFrames, and small Keras models."""

import contextlib
import os
import sys
import time
import uuid

import numpy as np
import pandas as pd
import pytest

# Under CI=true, a test skipped for any reason but the allowed ones fails the run: its hooks are this
# conftest's (support/skip_guard.py).
from support.skip_guard import pytest_runtest_logreport, pytest_sessionfinish  # noqa: F401

# Spark binds to the machine's external interface unless told otherwise; executors must run this
# interpreter (it has tfbarrier, TensorFlow and tf_keras).
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The tests' JVMs live seconds to minutes and run little hot code: C1 alone compiles it for about a quarter
# less CPU (test_gpus.py: 158 CPU-s against 186, test_memory.py: 109 against 138), and the suite is bound by
# its 2 cores.
# SPARK_SUBMIT_OPTS reaches the drivers' JVMs, SPARK_DAEMON_JAVA_OPTS standalone masters and workers,
# SPARK_LAUNCHER_OPTS the JVM that spark-submit starts first, make_spark's spark.executor.defaultJavaOptions
# the executors.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
for _variable in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS", "SPARK_LAUNCHER_OPTS"):
    os.environ.setdefault(_variable, TEST_JVM_OPTIONS)
# Every process this session starts (Spark's JVM, its Python workers, their training processes)
# inherits this tag, so leftover checks see this session's processes only, orphans included.
SESSION_TAG = uuid.uuid4().hex
os.environ["TFBARRIER_TEST_SESSION"] = SESSION_TAG


# `make test` deals the test files out to two pytest-xdist workers (--dist loadfile) in collection order:
# the longest go first, so that no worker is left with one of them at the end while the other idles. The
# order is the files' seconds in one run at cc8dd77 (pytest -n 2 --durations=0, summed per file: 309 s for
# test_presets.py down to 89 s; test_sharded.py, new since, placed by its own run); the files after them take less.
LONGEST_FIRST = ("test_presets.py", "test_hosts.py", "test_host_faults.py", "test_text.py", "test_sharded.py",
                 "test_failures.py", "test_spares.py", "test_memory.py", "test_exchanges.py", "test_gpus.py",
                 "test_docs_examples.py",
                 "test_evaluation.py", "test_fit.py", "test_cluster_checks.py", "test_environments.py",
                 "test_native.py", "test_connect.py", "test_attach.py", "test_checkpoints.py", "test_transfer.py",
                 "test_predict.py", "test_concurrency.py", "test_saving.py", "test_tracking.py", "test_tuning.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the others keep their order


def pytest_terminal_summary(terminalreporter):
    """The run's 25 slowest test phases (as --durations prints them) and each file's phases summed, into
    build/test-durations-pyspark<version>.txt, kept after the log scrolls away: where the suite's time goes."""
    import pyspark

    phases = [report for reports in terminalreporter.stats.values() for report in reports
              if getattr(report, "when", None) in ("setup", "call", "teardown") and hasattr(report, "duration")]
    slowest = sorted(phases, key=lambda report: report.duration, reverse=True)[:25]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build")
    os.makedirs(root, exist_ok=True)
    per_file = {}
    for report in phases:
        name = report.nodeid.split("::")[0]
        per_file[name] = per_file.get(name, 0.0) + report.duration
    with open(os.path.join(root, f"test-durations-pyspark{pyspark.__version__}.txt"), "w") as f:
        f.writelines(f"{report.duration:8.2f}s {report.when:8} {report.nodeid}\n" for report in slowest)
        f.write("\nEach file's phases summed:\n")
        f.writelines(f"{seconds:8.2f}s {name}\n" for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1]))


def succeeded(outcomes, name):
    """The outcome of a driver program's scenario ``name`` (``outcomes``: run_driver's), which must have
    raised nothing."""
    outcome = outcomes[name]
    assert "error" not in outcome, outcome
    return outcome


def run_driver(script, *args, timeout=420, env=None):
    """Run ``support/<script>`` (a driver program) in a Python process of its own (environment ``env``,
    default this one's), with this folder on its path, and return the JSON of its ``RESULT `` line;
    fails the test with the end of its stderr when there is none."""
    import json
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(env or os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, os.path.join(here, "support", script), *args], capture_output=True,
                         text=True, timeout=timeout, cwd=here, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines and out.returncode == 0, out.stderr[-4000:]
    return json.loads(lines[0][7:])


def _is_spare(pid):
    """A spare has not been adopted: its output still goes to its own directory, not a task's."""
    try:
        return "/tfbarrier-process-" in os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return False


TRAINING_NAMES = ("tfb-starting", "tfb-spare", "tfb-worker")  # training_process.py names itself so


def process_kind(pid):
    """"training" (a training process, started or forked by a keeper), "keeper", "relay" (keeper.py) or None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        return None
    if b"tfbarrier.spark.training_process" in command or (b"tfbarrier.spark.keeper" in command
                                                          and name in TRAINING_NAMES):
        return "training"
    if b"tfbarrier.spark.keeper" in command:
        return "relay" if name == "tfb-relay" else "keeper"
    return None


def training_processes(spares=False, tag=None, kind="training"):
    """PIDs of this test session's (or the session ``tag``'s) live training processes; idle spares
    (not adopted yet) only if asked. ``kind="keeper"``: the keepers of warm start (keeper.py)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if (process_kind(proc.pid) == kind
                    and proc.status() != psutil.STATUS_ZOMBIE
                    and (spares or not _is_spare(proc.pid))
                    and proc.environ().get("TFBARRIER_TEST_SESSION") == (tag or SESSION_TAG)):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def left_behind(seconds=10):
    """This session's training processes still alive after up to ``seconds``, or []. A fit returns or
    raises once Spark counts its tasks ended, a moment before a stopped training process has exited (a
    spare's keeper kills it when the task's socket closes): asserting at once would race that exit."""
    deadline = time.monotonic() + seconds
    while (found := training_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def session_listeners(endpoints):
    """This test session's processes that still listen on one of the ``host:port`` ``endpoints``. Only
    this session's: under pytest-xdist the other worker's fits may take a port this one let go."""
    import psutil

    ports = {int(endpoint.rsplit(":", 1)[1]) for endpoint in endpoints}
    held = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port in ports and conn.pid:
            try:
                if psutil.Process(conn.pid).environ().get("TFBARRIER_TEST_SESSION") == SESSION_TAG:
                    held.append((conn.pid, conn.laddr.port))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    return held


def meet_in_pairs(directory, pairs, seconds=300):
    """A fit's ``callbacks`` factory proving that fits train two at a time, whatever the machine's load:
    at the end of its training the chief of each of the first ``2 * pairs`` fits (in order of arrival)
    waits for its partner, the next fit's chief to arrive, and fails after ``seconds`` alone; later fits
    go on. Fits run one after another fail it. ``directory``: shared by the fits, on this machine."""
    def factory():
        import json
        import os
        import time
        import uuid

        import tf_keras

        class Meet(tf_keras.callbacks.Callback):
            def on_train_end(self, logs=None):
                if json.loads(os.environ["TF_CONFIG"])["task"]["index"] != 0:
                    return
                open(os.path.join(directory, uuid.uuid4().hex), "w").close()
                arrived = len(os.listdir(directory))
                if arrived > 2 * pairs:
                    return
                deadline = time.monotonic() + seconds
                while len(os.listdir(directory)) < arrived + arrived % 2:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"no other fit was training within {seconds} s")
                    time.sleep(0.1)

        return [Meet()]

    return factory


HELD_OUT = 300
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))


def make_spark(master="local[2]", **conf):
    import pyspark
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("tfbarrier-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.defaultJavaOptions", TEST_JVM_OPTIONS)
    )
    if tuple(map(int, pyspark.__version__.split(".")[:2])) < (4, 1):  # no DataFrame of ndarray rows without Arrow
        builder = builder.config("spark.sql.execution.arrow.pyspark.enabled", "true")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@pytest.fixture(scope="session")
def spark():
    session = make_spark()
    yield session
    session.stop()


def digits_frames():
    """(train, held_out) pandas frames of the 8x8 digits: a flat float array column and an int label."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = (x[order] / 16.0), y[order].astype("int64")
    frame = pd.DataFrame({"pixels": list(x), "digit": y})
    return frame.iloc[HELD_OUT:].reset_index(drop=True), frame.iloc[:HELD_OUT].reset_index(drop=True)


@pytest.fixture(scope="session")
def digits():
    return digits_frames()


@pytest.fixture(scope="session")
def digits_df(spark, digits):
    return spark.createDataFrame(digits[0]).cache()


def digits_cnn():
    """The slides' CNN (the demo's builder), sized for 8x8 digits, as a compiled Keras 3 model."""
    from mnist_demo import slides_cnn

    return slides_cnn((8, 8, 1), learning_rate=0.01)


def worker_model(model):
    """The tf_keras model a training process rebuilds from ``model``: same weights, same compile."""
    from tfbarrier.models.model_spec import ModelSpec
    from tfbarrier.spark.transfer import JobFiles

    with JobFiles() as files:
        return ModelSpec.from_model(model, files).build(files.directory)


def held_out_accuracy(model, held_out):
    x = np.stack(held_out["pixels"].to_numpy()).reshape(-1, 8, 8, 1).astype("float32")
    predicted = np.argmax(model.predict(x, verbose=0), axis=1)
    return float(np.mean(predicted == held_out["digit"].to_numpy()))


def partitioned(spark, frame, partition_of_row, num_partitions):
    """``frame`` as a Spark DataFrame whose row i lies in partition ``partition_of_row(i)``, in order."""
    schema = spark.createDataFrame(frame.iloc[:1]).schema
    rows = spark.createDataFrame(frame, schema).rdd.zipWithIndex().map(lambda pair: (pair[1], pair[0]))
    split = rows.partitionBy(num_partitions, partition_of_row).values()
    return spark.createDataFrame(split, schema)


def overshooting_line():
    """w·x, w = 0, trained by SGD(1.2) on MSE: with worker 0's rows at y = 2 and worker 1's at y = -3 (x = 1),
    each step is w -= 1.2 (2w + 1), which overshoots w = -0.5 further every step: after the steps of
    epochs 0, 1, 2, w = -1.2, 0.48, -1.872."""
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((1,)),
                                 tf_keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(optimizer=tf_keras.optimizers.SGD(1.2), loss="mse")
    return model


@pytest.fixture(scope="session")
def opposite_workers(spark):
    """(training, validation) DataFrames whose partition 0 (worker 0) holds rows at y = 2 and partition 1
    at y = -3. Validated on every row, val_loss = ((w - 2)² + (w + 3)²) / 2 rises every epoch (6.74, 7.2104,
    8.1324); on worker 0's rows alone it falls at epoch 1 (10.24, 2.3104), on worker 1's it rises (3.24,
    12.1104): only the value reduced across workers stops every worker at epoch 1."""
    import pandas as pd

    frame = pd.DataFrame({"x": [[1.0]] * 8, "y": [2.0] * 4 + [-3.0] * 4})
    return tuple(partitioned(spark, frame, lambda i: i // 4, 2) for _ in range(2))


@contextlib.contextmanager
def model_loads(spark, log):
    """Within: every predict model load by the executors of the jobs submitted is logged to ``log``. Yields a
    function giving the pids of the Python workers that loaded a model, a line per load."""
    import tfbarrier

    env = spark.sparkContext.environment  # executor environment of the jobs submitted from now on
    env[tfbarrier.settings.MODEL_LOAD_LOG_ENV] = str(log)
    try:
        yield lambda: [line.split()[0] for line in log.read_text().splitlines()]
    finally:
        del env[tfbarrier.settings.MODEL_LOAD_LOG_ENV]
