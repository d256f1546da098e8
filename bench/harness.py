"""Shared benchmark helpers: interleaved rounds, min/median/max, the machine and versions, and
writing a section of bench/README.md."""

import argparse
import atexit
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where sections are written: bench/README.md, or (make bench-quick) the file TFBARRIER_BENCH_README names.
README = os.path.join(ROOT, os.environ.get("TFBARRIER_BENCH_README", os.path.join("bench", "README.md")))


def scratch_dir(prefix):
    """A new directory in the temporary directory, removed when this benchmark's process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def local_spark_env():
    """What a benchmark's local Spark needs: loopback addresses, executors running this interpreter
    (it has tfbarrier and TensorFlow), and TensorFlow's start-up banners kept quiet."""
    import sys

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def local_spark(**conf):
    """A local[2] SparkSession for a benchmark's driver (no UI, no console progress), with ``conf``."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def clocked_fit(fit, rows):
    """Call ``fit(callbacks)``, a tfbarrier.fit given ``callbacks`` (a factory) to pass on, with worker 0's
    step clock (workloads.step_clock), once the machine settled. Returns the time from the call to the
    first finished step, the call's total and the samples per second of epochs 2.. (``rows`` a epoch)."""
    import json
    import tempfile

    import workloads

    clock = tempfile.mktemp(prefix="tfbarrier-bench-clock-", suffix=".json")
    settle()
    started = time.time()
    fit(lambda: [workloads.step_clock(clock)])
    total = time.time() - started
    with open(clock) as f:
        marks = json.load(f)
    os.remove(clock)
    ends = marks["epoch_ends"]
    return {"first_step": marks["first_step_end"] - started, "total": total,
            "throughput": (len(ends) - 1) * rows / (ends[-1] - ends[0])}


def worktree(ref):
    """The Python sources (``python/``) of git revision ``ref``, checked out under build/: how a
    benchmark runs an older tfbarrier next to this one (put it first on PYTHONPATH)."""
    path = os.path.join(ROOT, "build", f"worktree-{ref}")
    if not os.path.exists(path):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, ref], check=True,
                       stdout=subprocess.DEVNULL)
    return os.path.join(path, "python")


def env_with_source(source):
    """This process's environment, with ``source`` (an older revision's sources: ``worktree``) first on PYTHONPATH
    when given: how a benchmark runs that revision in a process of its own."""
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    return env


def driver_contenders_parser(fits, steps):
    """The arguments of a benchmark whose contenders are driver processes it starts (``--driver OUT --data DIR``,
    hidden): this tree against ``--baseline-ref``, ``--fits`` fits of ``--steps`` steps per driver, ``--rounds``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline-ref", help="this tree against that revision")
    parser.add_argument("--fits", type=int, default=fits)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    return parser


def interleaved(contenders, rounds):
    """Run each contender once per round, in turn (the machine is noisy: neighbours see the same
    noise); ``contenders`` maps a name to a function returning the amount of work done (rows,
    samples). Returns name -> list of work/second, one per round."""
    def rate(run):
        started = time.perf_counter()
        work = run()
        return work / (time.perf_counter() - started)

    return rounds_of({name: (lambda run=run: rate(run)) for name, run in contenders.items()}, rounds)


def settle(idle_percent=15.0, limit=60.0):
    """Wait until the machine is idle (CPU use over half a second below ``idle_percent``), so that
    work a contender left running (a spare process importing TensorFlow, a JVM collecting garbage)
    is not charged to the next one."""
    import psutil

    deadline = time.monotonic() + limit
    while psutil.cpu_percent(interval=0.5) > idle_percent and time.monotonic() < deadline:
        pass


def free_ports(count):
    """``count`` ports free on 127.0.0.1 now (a benchmark's processes bind them next)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def rounds_of(contenders, rounds, log=None):
    """Call each contender once per round, in turn; name -> list of what each call returned."""
    results = {name: [] for name in contenders}
    for number in range(rounds):
        for name, run in contenders.items():
            results[name].append(run())
            if log:
                log(f"round {number + 1}/{rounds} {name}: {results[name][-1]}")
    return results


def stats(values):
    return min(values), statistics.median(values), max(values)


def machine():
    import numpy
    import pyarrow
    import pyspark
    import tensorflow

    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores ({cpu()}), {memory_gib:.0f} GiB, Python {platform.python_version()}, "
            f"pyspark {pyspark.__version__}, TensorFlow {tensorflow.__version__}, numpy {numpy.__version__}, "
            f"pyarrow {pyarrow.__version__}")


def _cpu_fields():
    with open("/proc/cpuinfo") as info:
        first = info.read().split("\n\n")[0]  # the first CPU's block
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}


def avx512():
    """Whether this CPU has AVX-512 (TensorFlow then turns oneDNN on by default)."""
    return "avx512f" in _cpu_fields().get("flags", "").split()


def cpu():
    """The CPU's model name, the features that decide TensorFlow's oneDNN default (AVX-512 and its
    neural-network extensions), and whether oneDNN is on in this process (TF_ENABLE_ONEDNN_OPTS)."""
    fields = _cpu_fields()
    model = " ".join(fields.get("model name", platform.processor()).split())
    flags = fields.get("flags", "").split()
    features = [f for f in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    return f"{model}, {', '.join(features) if features else 'no AVX-512'}, oneDNN {'on' if onednn_on() else 'off'}"


def command():
    """This benchmark's command line, as it is rerun from the repository's root."""
    prefix = "PYTHONPATH=build/bench-site " if "bench-site" in os.environ.get("PYTHONPATH", "") else ""
    prefix += "TF_ENABLE_ONEDNN_OPTS=0 " if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0" and "--onednn" not in sys.orig_argv else ""
    argv = sys.orig_argv[next(i for i, arg in enumerate(sys.orig_argv) if arg.endswith(".py")):]  # as typed
    script = os.path.relpath(os.path.abspath(argv[0]), ROOT)
    return prefix + " ".join([".venv/bin/python", script, *map(shlex.quote, argv[1:])])


def run_line(**known):
    """The line a script reads of a section (tests/python/test_bench_readme.py): the command that wrote it,
    the revision, the date and the machine, as JSON in an HTML comment. ``known`` overrides the fields."""
    fields = {"command": command(), "revision": revision(), "date": str(date.today()), "cpu": cpu(),
              "avx512": avx512()}
    fields.update(known)
    return f"<!-- run {json.dumps(fields)} -->"


def onednn_on():
    """Whether TensorFlow runs its oneDNN kernels in this process (the CPU's default, or TF_ENABLE_ONEDNN_OPTS)."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def revision():
    """The commit measured, with "+ changes" when its code (the package, the benchmarks) differs from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    changed = git("status", "--porcelain", "--", "python", "bench/*.py")
    return git("rev-parse", "--short", "HEAD") + (" + changes" if changed else "")


def write_section(name, body):
    """Replace (or append) the section between the markers for ``name`` in bench/README.md."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = f"{begin}\n{body.strip()}\n\n_Run on {date.today()} at {revision()}: {machine()}._\n{run_line()}\n{end}"
    text = open(README).read() if os.path.exists(README) else "# Benchmarks\n"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: section, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    with open(README, "w") as f:
        f.write(text)


def metric_table(results, metric, unit, baseline, digits=1):
    """Like ``table`` for one ``metric`` of contenders whose rounds returned dicts; adds the
    difference of medians to ``baseline`` (for times: the seconds a contender adds)."""
    values = {name: [r[metric] for r in rounds] for name, rounds in results.items()}
    base = statistics.median(values[baseline])
    lines = [f"| contender | min {unit} | median {unit} | max {unit} | median / {baseline} | median - {baseline} |",
             "|---|---|---|---|---|---|"]
    for name, series in values.items():
        low, mid, high = stats(series)
        lines.append(f"| {name} | {low:,.{digits}f} | {mid:,.{digits}f} | {high:,.{digits}f} | {mid / base:.2f} "
                     f"| {mid - base:+,.{digits}f} |")
    return "\n".join(lines)


def table(rates, unit, baseline):
    """A markdown table of min/median/max per contender and the ratio of medians to ``baseline``."""
    base = statistics.median(rates[baseline])
    lines = [f"| contender | min {unit} | median {unit} | max {unit} | median / {baseline} |", "|---|---|---|---|---|"]
    for name, values in rates.items():
        low, mid, high = stats(values)
        lines.append(f"| {name} | {low:,.0f} | {mid:,.0f} | {high:,.0f} | {mid / base:.2f} |")
    return "\n".join(lines)
