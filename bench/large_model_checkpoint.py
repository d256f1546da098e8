"""The cost of fit(checkpoint_every=) on the 61 M model (large_model_bench.py --checkpoint, issue 29): 16
steps with and without a save every 4 steps, interleaved, the seconds each save holds the step loop, and the
floor's: one process writing the same weights with tf.train.Checkpoint."""

import statistics
import tempfile

import harness
from large_model_runs import BATCH, fmt, keras_files, run_driver, run_floor


def checkpoint_section(rounds, name="mlp61-sgd", steps=16, every=4):
    """16 steps with and without a checkpoint every 4 steps, interleaved, with the floor's write."""
    runs = {"checkpoint_dir alone": [], f"checkpoint_every={every}": []}
    writes = []
    with tempfile.TemporaryDirectory(prefix="large-bench-") as directory:
        keras_file = keras_files([name], directory)[name]
        for _ in range(rounds):
            harness.settle()
            writes.append(run_floor(name, keras_file)["write_seconds"])
            for label, every_steps in (("checkpoint_dir alone", 0), (f"checkpoint_every={every}", every)):
                harness.settle()
                runs[label].append(run_driver(name, fits=1, steps=steps, checkpoint_every=every_steps)["fits"][0])
    base = statistics.median(f["training"] for f in runs["checkpoint_dir alone"])
    lines = [f"`.venv/bin/python bench/large_model_bench.py --checkpoint --rounds {rounds}`: the cost of "
             f"`checkpoint_every` ({name}, {steps} steps of global batch {BATCH} in one epoch, with `checkpoint_dir`: "
             f"a save at the epoch's end alone, or also every {every} steps). Training seconds and the seconds a "
             "save holds the chief's step loop (reading the metrics, writing the checkpoint, the closing "
             "all-reduce), median (min-max) of the rounds, against the floor: one process (no fit, no "
             "strategy) writing the same model with tf.train.Checkpoint.", "",
             "| fit | training s | samples/s | / checkpoint_dir alone | saves | s per save | floor's write s |",
             "|---|---|---|---|---|---|---|"]
    for label, fits in runs.items():
        seconds = [f["training"] for f in fits]
        per_save = [f["save_seconds"] / f["saves"] for f in fits]
        lines.append(f"| {label} | {fmt(seconds)} | {steps * BATCH / statistics.median(seconds):,.0f} | "
                     f"{base / statistics.median(seconds):.2f} | {fits[0]['saves']} | {fmt(per_save, 2)} | "
                     f"{fmt(writes, 2)} |")
    return "\n".join(lines)
