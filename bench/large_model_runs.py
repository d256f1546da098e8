"""large_model_bench.py's measuring subprocesses, each run on its own and read back as the JSON it writes: the
floor (one plain process), tfbarrier's driver, Spark's share (spark_share.py), the models saved once; and
how their numbers are written. Shared by large_model_bench.py and large_model_checkpoint.py."""

import json
import os
import subprocess
import sys
import tempfile
import time

import harness

BENCH = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(BENCH, "large_model_bench.py")  # its subcommands: floor, driver, save
BATCH = 64  # the global batch of its fits


def json_of(command, flag="--out"):
    """What the subprocess ``command`` wrote as JSON to the file it is given with ``flag``."""
    path = tempfile.mktemp(suffix=".json")
    subprocess.run([*command, flag, path], check=True)
    with open(path) as f:
        result = json.load(f)
    os.remove(path)
    return result


def run_floor(name, keras_file):
    return json_of([sys.executable, SCRIPT, "floor", "--model", name, "--file", keras_file,
                     "--started", repr(time.time())], flag="--clock")


def run_spark_share():
    return json_of([sys.executable, os.path.join(BENCH, "spark_share.py")])


def run_driver(name, fits=2, steps=None, checkpoint_every=None):
    command = [sys.executable, SCRIPT, "driver", "--model", name, "--fits", str(fits)]
    if steps:
        command += ["--steps", str(steps)]
    if checkpoint_every is not None:
        command += ["--checkpoint-every", str(checkpoint_every)]
    return json_of(command)


def keras_files(names, directory):
    """Each model saved once as a tf_keras .keras file, what the floor loads (each in a process of its
    own: TensorFlow's allocator keeps what it once held)."""
    paths = {}
    for name in names:
        paths[name] = os.path.join(directory, f"{name}.keras")
        subprocess.run([sys.executable, SCRIPT, "save", "--model", name, "--file", paths[name]], check=True)
    return paths


def fmt(values, digits=1):
    low, mid, high = harness.stats(values)
    return f"{mid:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"
