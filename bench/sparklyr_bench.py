"""How an R/sparklyr user's table reaches tfbarrier and comes back, two ways, side by side:

  attached   tfbarrier's Python attaches to the sparklyr connection's own driver JVM (tf_spark_session(sc):
             Spark's Py4JServer started there, tfbarrier.attach(port, secret, embedded=True)); the table
             crosses as a temporary view, the predictions come back as one: one Spark application, no files.
  exchange   a second Spark application (tf_spark_connect()): sparklyr writes the table to Parquet in the
             exchange directory (spark_write_parquet), tfbarrier's session reads it (vector columns as
             arrays: tfbarrier.frames.vectors_as_arrays), trains and scores there, and writes the
             predictions back to Parquet, which sparklyr reads (spark_read_parquet).

sparklyr (and R) cannot be installed on this machine, so Python stands in for both of sparklyr's sides,
each a process of its own (sparklyr_child.py), as in tests/python/test_attach.py:

  the owner   a stand-in for sparklyr's driver JVM: a Python process that starts a local[2] SparkSession
              (SPARK_LOCAL_IP and spark.driver.host 127.0.0.1, no UI, spark.tfbarrier.warmStart at its
              default) and holds the user's table: --rows rows of 8 numeric columns (rand(seed) over
              spark.range) and an integer label from a linear rule, with a VectorAssembler "features"
              column, cached and counted before any clock starts (sparklyr's reads cache by default). It
              does what sparklyr would: starts the Py4JServer and registers the table as a view, or
              writes it to Parquet, and collects the aggregate (groupBy label, prediction: count) of
              the predictions that came back.
  the R side  a stand-in for the R session, running tfbarrier's Python as reticulate would (pyspark,
              tfbarrier and Keras imported before any clock starts): it attaches (attached) or starts its
              own local[2] SparkSession (exchange), reads the table, fits a Keras 8-16-2 MLP (Adam, 2
              epochs, global batch 1024, 2 workers) and scores it (tfbarrier.predict). While the owner
              collects the aggregate the R side is stopped (SIGSTOP), as an R session busy in sparklyr
              runs no Python.

Phases, in seconds, timed by this script between its commands to the two processes:

  to_tfbarrier      making the table reachable by tfbarrier's side. attached: the Py4JServer's start and
                    the view's registration (owner), attach and spark.table (R side). exchange: the R
                    side's own SparkSession, the owner's Parquet write, the R side's read. "of which
                    session" is the Py4JServer's start plus attach, or the second application's start
                    (which an R session pays once, in tf_spark_connect()).
  fit               building and compiling the model, tfbarrier.fit.
  predict_and_back  tfbarrier.predict, the crossing back (a view, or a Parquet write and read) and the
                    owner's aggregate (predictions are lazy: attached, they are computed by the
                    owner's collect).
  total             the sum of the three.
  disk_bytes        bytes in the exchange directory after the round (both modes are given one; attached
                    writes none).
  jvms              Spark driver JVMs (java ... SparkSubmit) seen under the two processes.

Each round starts both processes afresh for each mode (cold: no spare training processes), the modes'
order alternating round by round; the machine settles before each mode. Every process started is
stopped at the end, on errors too (this script's children and everything they started, found by an
environment tag this script gives them).

    .venv/bin/python bench/sparklyr_bench.py [--rows 1000000] [--rounds 1] [--out FILE]
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import harness  # noqa: E402
from sparklyr_child import COLUMNS, Child  # noqa: E402 - the two processes (the owner, the R side)

MODES = ("attached", "exchange")
TAG = "TFBARRIER_SPARKLYR_BENCH"  # in the environment of every process this script starts (and theirs)


# ---------------------------------------------------------------------------------------------------
# The main process: starts the two processes per mode and round, times the phases, cleans up.


def tagged(tag):
    """Live processes whose environment carries this run's tag: this script's children and all they
    started (Spark's JVM, Python workers, training processes, spares and their keepers)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.status() != psutil.STATUS_ZOMBIE \
                    and proc.environ().get(TAG) == tag:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def end_tagged(tag, grace=10.0):
    """End (by PID) every process still carrying ``tag``: SIGTERM, then SIGKILL after ``grace`` s.
    Returns how many there were."""
    import psutil

    left = tagged(tag)
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline:  # a stopped Spark's workers and spares exit on their own
        time.sleep(0.5)
        left = tagged(tag)
    for proc in left:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(left, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
    return len(left)


def disk_bytes(path):
    return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


def run_mode(mode, number, args, work, tag):
    """One round of ``mode`` with fresh processes: the phases' seconds, disk_bytes, jvms and checks."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, TF_CPP_MIN_LOG_LEVEL="2")
    env[TAG] = tag
    exchange = os.path.join(work, f"exchange-{mode}-{number}")
    os.makedirs(exchange)
    config = {"rows": args.rows, "driver_memory": args.driver_memory}
    children = []
    try:
        owner = Child("owner", config, env, os.path.join(work, f"owner-{mode}-{number}.log"))
        children.append(owner)
        r_side = Child("r-side", config, env, os.path.join(work, f"r-side-{mode}-{number}.log"))
        children.append(r_side)
        harness.settle()
        jvms = set()
        times = {}

        given, session = timed(times, "to_tfbarrier", lambda: to_tfbarrier(mode, owner, r_side, exchange))
        jvms |= owner.jvms() | r_side.jvms()
        fitted = timed(times, "fit", lambda: r_side.ask(op="fit"))
        jvms |= owner.jvms() | r_side.jvms()
        groups = timed(times, "predict_and_back", lambda: predict_and_back(mode, owner, r_side, exchange))
        jvms |= owner.jvms() | r_side.jvms()

        times["total"] = times["to_tfbarrier"] + times["fit"] + times["predict_and_back"]
        counted = sum(count for _, _, count in groups)
        check_round(mode, args.rows, fitted, counted, same_app=given["app_id"] == owner.ready["app_id"])
        return dict(times, session=session, disk_bytes=disk_bytes(exchange), jvms=len(jvms),
                    accuracy=sum(count for label, prediction, count in groups if label == prediction) / counted,
                    loss=fitted["loss"])
    finally:
        for child in reversed(children):
            child.stop()
        shutil.rmtree(exchange, ignore_errors=True)


def timed(times, phase, run):
    """What ``run()`` returns; its seconds in ``times[phase]``."""
    started = time.perf_counter()
    outcome = run()
    times[phase] = time.perf_counter() - started
    return outcome


def to_tfbarrier(mode, owner, r_side, exchange):
    """The table made reachable by the R side's tfbarrier: (the R side's answer, the session's seconds)."""
    if mode == "attached":
        served = owner.ask(op="serve", view="tfbarrier_in")
        given = r_side.ask(op="attach", port=served["port"], secret=served["secret"],
                           pin_thread=served["pin_thread"], view="tfbarrier_in")
        return given, served["server_seconds"] + given["session_seconds"]
    given = r_side.ask(op="connect")
    owner.ask(op="write", path=os.path.join(exchange, "tbl"))
    r_side.ask(op="read", path=os.path.join(exchange, "tbl"))
    return given, given["session_seconds"]


def predict_and_back(mode, owner, r_side, exchange):
    """The R side's predictions, back to the owner: its aggregate's groups (label, prediction, count)."""
    back = {"view": "tfbarrier_out"} if mode == "attached" else {"path": os.path.join(exchange, "out")}
    r_side.ask(op="predict", **back)
    os.kill(r_side.proc.pid, signal.SIGSTOP)  # R runs no Python while sparklyr collects
    try:
        return owner.ask(op="aggregate", **back)["groups"]
    finally:
        os.kill(r_side.proc.pid, signal.SIGCONT)


def check_round(mode, rows, fitted, counted, same_app):
    """That the fit and the aggregate saw every row, and the R side ran in the owner's application
    exactly when attached."""
    if counted != rows or fitted["rows"] != rows:
        raise RuntimeError(f"{mode}: the fit saw {fitted['rows']} rows and the aggregate counted {counted}, "
                           f"not {rows}")
    if same_app != (mode == "attached"):
        raise RuntimeError(f"{mode}: the R side ran in {'the owner' if same_app else 'another'}'s application")


ROWS = [("to_tfbarrier", "to_tfbarrier (s)", 2), ("session", "of which session (s)", 2), ("fit", "fit (s)", 2),
        ("predict_and_back", "predict_and_back (s)", 2), ("total", "total (s)", 2),
        ("disk_bytes", "disk_bytes", 0), ("jvms", "jvms", 0)]


def markdown(results, rounds):
    def cell(values, digits):
        mid = statistics.median(values)
        text = f"{mid:,.{digits}f}"
        if rounds > 1:
            text += f" ({min(values):,.{digits}f}-{max(values):,.{digits}f})"
        return text

    lines = ["| phase | attached | exchange | exchange / attached |", "|---|---|---|---|"]
    for key, label, digits in ROWS:
        series = {mode: [r[key] for r in results[mode]] for mode in MODES}
        base, other = statistics.median(series["attached"]), statistics.median(series["exchange"])
        ratio = f"{other / base:.2f}" if base else ("-" if not other else "n/a (attached: 0)")
        lines.append(f"| {label} | {cell(series['attached'], digits)} | {cell(series['exchange'], digits)} "
                     f"| {ratio} |")
    return "\n".join(lines)


def header(args):
    from importlib.metadata import PackageNotFoundError, version

    def installed(*names):  # the first distribution of these names that is installed
        for name in names:
            try:
                return f"{names[0]} {version(name)}"
            except PackageNotFoundError:
                pass
        return f"{names[0]} (not found)"

    model = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in model.splitlines() if line.startswith("Model name")),
                 "unknown CPU")
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = ", ".join((installed("pyspark"), installed("tensorflow", "tensorflow-cpu", "tensorflow_cpu"),
                          installed("keras"), installed("pyarrow")))
    return (f"## sparklyr: an attached session against the exchange directory\n\n"
            f"`.venv/bin/python bench/sparklyr_bench.py --rows {args.rows} --rounds {args.rounds}`: "
            f"{args.rows:,} rows of {len(COLUMNS)} doubles, an int label and their VectorAssembler column; "
            "tfbarrier.fit of an MLP 8-16-2 (Adam), 2 epochs, global batch 1024, 2 workers, local[2]; "
            "tfbarrier.predict; the owner's groupBy(label, prediction).count(). Python stands in for sparklyr "
            "(owner: the driver JVM's process) and R (R side). "
            f"Median over {args.rounds} round(s){' (min-max)' if args.rounds > 1 else ''}, "
            "fresh processes each mode and round, the order alternating.\n\n"
            f"Machine: {model}, {os.cpu_count()} cores, {memory_gib:.0f} GiB; revision {harness.revision()}; "
            f"{versions}.")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the user's table (1,000,000)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of both modes, order alternating (1)")
    parser.add_argument("--out", help="write the header and table to this file instead of bench/README.md")
    parser.add_argument("--driver-memory", default="2g",
                        help="spark.driver.memory of each local[2] application, both modes (2g)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks below
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    top = header(args)  # before the rounds: what is measured, on what machine, at which revision
    tag = uuid.uuid4().hex
    work = tempfile.mkdtemp(prefix="tfbarrier-sparklyr-bench-")
    results = {mode: [] for mode in MODES}
    try:
        for number in range(args.rounds):
            for mode in (MODES if number % 2 == 0 else MODES[::-1]):
                outcome = run_mode(mode, number, args, work, tag)
                results[mode].append(outcome)
                print(f"round {number + 1}/{args.rounds} {mode}: "
                      + ", ".join(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
                                  for key, value in outcome.items()), file=sys.stderr, flush=True)
                stray = end_tagged(tag)
                if stray:
                    print(f"  ({stray} process(es) of this round were still alive after it and were ended)",
                          file=sys.stderr, flush=True)
    finally:
        end_tagged(tag, grace=2.0)
        shutil.rmtree(work, ignore_errors=True)
    accuracy = "; ".join(f"{mode} {statistics.median(r['accuracy'] for r in results[mode]):.3f}" for mode in MODES)
    body = (top + "\n\n" + markdown(results, args.rounds)
            + f"\n\nBoth modes' fits trained on and aggregates counted all {args.rows:,} rows (checked every round). "
            f"The predictions' accuracy on the training rows (unseeded fits: it varies round to round): {accuracy}.")
    print(body)
    if args.out:
        with open(args.out, "w") as f:
            f.write(body + "\n")
    else:
        harness.write_section("sparklyr", body)


if __name__ == "__main__":
    main()
