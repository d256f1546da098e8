"""A LoRA fine-tune of a preset the training processes load (issue 60), against one plain process doing the same.

A Llama-architecture causal LM built from a config (no download), saved as a preset directory, fine-tuned
with rank-4 adapters from token id columns: ``tfbarrier.fit(df, tfbarrier.preset(path, lora_rank=4))`` with 2
workers on local[2], against one plain Python process that loads the same preset and fits the same number of
steps of the same global batch on the same 2 cores. Each side runs in a process of its own:

- plain: ``from_preset``, ``enable_lora``, ``fit``; its peak resident memory (``ru_maxrss``) and its samples per
  second after the first step (the fit's time less its first step's);
- tfbarrier: a driver of its own; each training process's peak (``FitResult.workers[i]["memory"]``), samples
  per second as the chief's timings say (training less the first step), the bytes each worker sent through the
  ring per step against the adapters' size, and the driver's growth during the fit (its resident memory sampled
  every 0.1 s, against what it held before the call) against the preset's weights.

    .venv/bin/python bench/preset_bench.py [--size 120m|250m|1b|3b] [--rounds 2] [--steps 6]

With ``--quantized``, three tfbarrier fits side by side instead (issue 74): the float32 preset, the same preset
quantized to int8 by each training process (``preset(path, lora_rank=4, quantize="int8")``), and a preset saved
quantized once (``task.quantize("int8")``, ``save_to_preset``: loaded in int8, its float weights never held);
each training process's peak and samples per second, as ratios of the float32 fit's, and the final loss.

    .venv/bin/python bench/preset_bench.py --quantized [--size 120m|250m|1b|3b] [--rounds 2] [--steps 6]
"""

import argparse
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import harness  # noqa: E402
from memory_probes import PeakSampler, process_mb, resident_mb  # noqa: E402

harness.local_spark_env()

SEQUENCE, RANK = 64, 4
SIZES = {  # LlamaBackbone settings; 1b is TinyLlama's shape (1.1 B parameters)
    "120m": dict(vocabulary_size=8192, num_layers=8, num_query_heads=8, num_key_value_heads=8, hidden_dim=1024,
                 intermediate_dim=2816),
    "250m": dict(vocabulary_size=32000, num_layers=14, num_query_heads=8, num_key_value_heads=8, hidden_dim=1024,
                 intermediate_dim=2816),
    "1b": dict(vocabulary_size=32000, num_layers=22, num_query_heads=32, num_key_value_heads=4, hidden_dim=2048,
               intermediate_dim=5632),
    "3b": dict(vocabulary_size=32000, num_layers=26, num_query_heads=32, num_key_value_heads=32, hidden_dim=3200,
               intermediate_dim=8640),  # OpenLLaMA 3B's shape (3.4 B parameters)
}
BATCH = {"120m": 16, "250m": 8, "1b": 4, "3b": 2}  # the global batch: rows of SEQUENCE tokens
FIT_PHASES = ("prepare", "stage_start", "data_shard", "worker_start", "tensorflow_import", "strategy_and_model",
              "first_step", "trained_model_written")  # FitResult.timings' keys the time table shows


def prepare(model):
    """Each side's compile of the loaded task (tfbarrier's prepare=)."""
    import keras

    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def rows(size, steps):
    import numpy as np

    rng = np.random.default_rng(0)
    vocabulary = SIZES[size]["vocabulary_size"]
    tokens = rng.integers(1, vocabulary, (BATCH[size] * steps, SEQUENCE + 1)).astype(np.int32)
    return {"ids": tokens[:, :-1], "mask": np.ones((len(tokens), SEQUENCE), np.int32),
            "labels": tokens[:, 1:].astype(np.int64)}


def save(size, path):
    """Build the model from its config and save it as a preset directory; prints its parameters and bytes."""
    import keras_hub

    started = time.time()
    backbone = keras_hub.models.LlamaBackbone(**SIZES[size])
    model = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    built = time.time()
    model.save_to_preset(path)
    weights = sum(int(w.numpy().nbytes) for w in model.weights)
    print("RESULT " + json.dumps({"parameters": model.count_params(), "weights_bytes": weights,
                                  "built": built - started, "saved": time.time() - built}), flush=True)


def save_quantized(path, quantized):
    """The preset at ``path`` quantized to int8 once and saved at ``quantized`` (in a process of its own: it holds
    the float weights, as a user's one conversion would)."""
    import keras_hub

    task = keras_hub.models.CausalLM.from_preset(path)
    task.quantize("int8")
    task.save_to_preset(quantized)
    print("RESULT " + json.dumps({"bytes": sum(e.stat().st_size for e in os.scandir(quantized))}), flush=True)


def first_step_clock():
    """A Keras 3 callback whose ``first`` is the time its first step ended (workloads.step_clock is tf_keras's)."""
    import keras

    class Clock(keras.callbacks.Callback):
        first = None

        def on_train_batch_end(self, batch, logs=None):
            self.first = self.first or time.time()

    return Clock()


def loaded(path):
    """The preset's task loaded here, its adapters enabled, compiled: the model object a user would fit."""
    import keras_hub

    model = keras_hub.models.CausalLM.from_preset(path)
    model.backbone.enable_lora(RANK)
    prepare(model)
    return model


def plain(size, path, steps):
    data = rows(size, steps)
    loading = time.time()
    model = loaded(path)
    load_seconds = time.time() - loading
    clock = first_step_clock()
    started = time.time()
    model.fit({"token_ids": data["ids"], "padding_mask": data["mask"]}, data["labels"], batch_size=BATCH[size],
              epochs=1, shuffle=False, verbose=0, callbacks=[clock])
    ended = time.time()
    adapters = sum(int(w.numpy().nbytes) for w in model.trainable_weights)
    print("RESULT " + json.dumps({
        "peak_mb": resident_mb()[1], "throughput": (steps - 1) * BATCH[size] / (ended - clock.first),
        "adapters_bytes": adapters, "phases": {"model_loaded": load_seconds, "first_step": clock.first - started,
                                               "steps_after_the_first": ended - clock.first}}), flush=True)


def distributed(size, path, steps, quantize=None, model_object=False):
    """tfbarrier's 2 workers fine-tune the preset at ``path``: named (``tfbarrier.preset``), or where
    ``model_object``, as a model object this driver loads, LoRA enabled and compiled (issue 74, item 4)."""
    import pandas as pd

    import tfbarrier

    spark = harness.local_spark()
    data = rows(size, steps)
    df = spark.createDataFrame(pd.DataFrame({name: list(values) for name, values in data.items()}))
    df = df.repartition(2).cache()
    df.count()
    model = loaded(path) if model_object else tfbarrier.preset(path, lora_rank=RANK, prepare=prepare, quantize=quantize)
    before = resident_mb()[0]
    try:
        with PeakSampler(process_mb(os.getpid()), 0.1) as driver:
            result = tfbarrier.fit(df, model,
                                   features={"token_ids": "ids", "padding_mask": "mask"}, label="labels",
                                   batch_size=BATCH[size], epochs=1, steps_per_epoch=steps, num_workers=2, verbose=0)
    except tfbarrier.errors.TfBarrierError as error:  # the memory check's refusal is a result: the model is too large
        if "needs about" not in str(error):
            raise
        print("RESULT " + json.dumps({"refused": str(error)}), flush=True)
        return
    chief = result.workers[0]
    steady = chief["timings"]["training"] - chief["timings"]["first_step"]
    phases = {key: result.timings[key] for key in FIT_PHASES if key in result.timings}
    print("RESULT " + json.dumps({
        "peak_mb": max(w["memory"]["peak_mb"] for w in result.workers),
        "estimate_mb": max(w["memory"]["estimate_mb"] for w in result.workers),  # the memory check's, in the process
        "throughput": (steps - 1) * BATCH[size] / steady,
        "sent_per_step": max(w["communication"]["bytes_sent"] for w in result.workers) / steps,
        "driver_growth_mb": max(0.0, driver.peak_mb - before),
        "loss": result.history["loss"][-1],
        "phases": {**phases, "steps_after_the_first": steady, "fit": result.timings["total"]}}), flush=True)
    spark.stop()


def role(name, *args):
    """Run this file's role ``name`` in a process of its own: its RESULT, with the process's wall time."""
    started = time.time()
    out = subprocess.run([sys.executable, __file__, "--role", name, *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{name} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    return {**result, "wall": time.time() - started}


ROWS = {"tfbarrier": "tfbarrier, 2 workers, the preset by name",
        "tfbarrier-object": "tfbarrier, 2 workers, a model object the driver loaded"}


def section(args, model, runs):
    plain_runs, tfb = runs["plain"], runs["tfbarrier"]
    _, plain_peak, _ = harness.stats([r["peak_mb"] for r in plain_runs])
    _, plain_rate, _ = harness.stats([r["throughput"] for r in plain_runs])
    _, growth, _ = harness.stats([r["driver_growth_mb"] for r in tfb])
    sent = tfb[0]["sent_per_step"]
    adapters = plain_runs[0]["adapters_bytes"]
    weights_mb = model["weights_bytes"] / 2**20
    flag = " --model-object" if "tfbarrier-object" in runs else ""
    lines = [
        f"`.venv/bin/python bench/preset_bench.py --size {args.size} --rounds {args.rounds} --steps {args.steps}"
        f"{flag}`: "
        f"a Llama-architecture causal LM of {model['parameters'] / 1e6:,.1f} M parameters ({weights_mb:,.0f} MB) "
        f"built from a config and saved as a preset, rank-{RANK} adapters ({adapters / 2**20:.2f} MB), "
        f"{args.steps} steps of global batch {BATCH[args.size]} x {SEQUENCE} tokens; tfbarrier's 2 workers load the "
        "preset on local[2]" + (" (or the driver loads it and fits the model object)" if flag else "")
        + ", one plain process loads it on the same 2 cores. Medians of the rounds (throughput: min-max). "
        "Targets: peak at most 1.1x, throughput at least 0.9x the plain process's; the driver's growth at most 5% "
        "of the weights" + (" (the preset by name)" if flag else "") + ".", "",
        "| | peak MB a process | samples/s after the first step | vs plain |",
        "|---|---|---|---|",
        f"| plain process | {plain_peak:,.0f} | {plain_rate:.2f} | 1.00 |"]
    for name, title in ROWS.items():
        if name in runs:
            _, peak, _ = harness.stats([r["peak_mb"] for r in runs[name]])
            low, rate, high = harness.stats([r["throughput"] for r in runs[name]])
            lines.append(f"| {title if flag else 'tfbarrier, 2 workers'} | {peak:,.0f} ({peak / plain_peak:.2f}x) | "
                         f"{rate:.2f} ({low:.2f}-{high:.2f}) | {rate / plain_rate:.2f} |")
    return "\n".join(lines + [
        "", f"The driver grew by {growth:,.0f} MB during the fit ({growth / weights_mb:.1%} of the weights). Each "
        f"worker sent {sent / 2**20:.2f} MB a step through the ring (the adapters' gradients, the logs; the checksums "
        f"and the epoch's end included), against {adapters / 2**20:.2f} MB of adapters.", "",
        f"Where the time went (medians of the rounds; building the model from its config took {model['built']:,.0f} s "
        f"and saving it as a preset {model['saved']:,.0f} s, once, before the rounds; the phases overlap where a "
        "row says so):", "", time_table(runs)])


PHASE_NAMES = {  # a phase's key: its words in the time table
    "prepare": "the driver's checks before the stage", "stage_start": "Spark starting the stage",
    "data_shard": "the partition streamed to the shard", "worker_start": "the training process started",
    "tensorflow_import": "TensorFlow imported", "model_loaded": "the preset loaded, adapters on, compiled",
    "strategy_and_model": "the model built in each process, adapters on, compiled, the memory check's traced step",
    "first_step": "the first step (its tracing)", "steps_after_the_first": "the steps after the first",
    "trained_model_written": "the adapters written for the driver", "fit": "the whole fit call",
    "wall": "the whole process (Python, imports, Spark, the fit)",
}


def time_table(runs):
    """Where each contender's time went: the median seconds of each phase over the rounds."""
    keys = [key for key in PHASE_NAMES if key == "wall" or any(key in r["phases"] for rs in runs.values() for r in rs)]
    lines = ["| seconds | " + " | ".join(runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for key in keys:
        cells = []
        for contender in runs.values():
            values = [r["wall"] if key == "wall" else r["phases"].get(key) for r in contender]
            cells.append("-" if None in values else f"{statistics.median(values):,.1f}")
        lines.append(f"| {PHASE_NAMES[key]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


TARGETS = {  # issue 74's, by size
    "120m": "Targets (issue 74, for the 1.1 B preset): int8's peak at most 0.5x, its throughput at least 0.8x "
            "float32's.",
    "1b": "Targets (issue 74): int8's peak at most 0.5x, its throughput at least 0.8x float32's.",
    "3b": "Target (issue 74): the largest preset whose LoRA fine-tune trains on this machine's 2 workers is at least "
          "3 B parameters.",
}
QUANTIZED = {  # contender: (which preset, quantize=)
    "float32 preset": ("float", None),
    "int8, quantized by each process": ("float", "int8"),
    "int8 preset, saved quantized": ("int8", "int8"),
}


def refusal(runs):
    """The memory check's words when it refused a contender's fit (the same in every round), else None."""
    refused = runs[0].get("refused")
    if refused is None:
        return None
    need, can = (re.search(pattern + r" about ([\d.,]+ [KMGT]?B)", refused) for pattern in ("needs", "can have"))
    return f"refused by the memory check: needs about {need[1]}, can have {can[1]}" if need and can else refused


def quantized_section(args, model, saved, runs):
    trained = {name: contender for name, contender in runs.items() if refusal(contender) is None}
    base = runs["float32 preset"]
    base_peak = refusal(base) is None and harness.stats([r["peak_mb"] for r in base])[1]
    base_rate = refusal(base) is None and harness.stats([r["throughput"] for r in base])[1]
    lines = [
        f"`.venv/bin/python bench/preset_bench.py --quantized --size {args.size} --rounds {args.rounds} --steps "
        f"{args.steps}`: the Llama-architecture causal LM of {model['parameters'] / 1e6:,.1f} M parameters "
        f"({model['weights_bytes'] / 2**20:,.0f} MB in float32; {saved['bytes'] / 2**20:,.0f} MB saved in int8), "
        f"rank-{RANK} adapters, {args.steps} steps of global batch {BATCH[args.size]} x {SEQUENCE} tokens, "
        "tfbarrier's 2 workers on local[2] each time. Medians of the rounds (min-max). " + TARGETS.get(args.size, ""),
        "",
        "| | peak MB a training process | vs float32 | samples/s after the first step | vs float32 | last loss | "
        "the check's estimate / peak |", "|---|---|---|---|---|---|---|"]
    for name, contender in runs.items():
        if name not in trained:
            lines.append(f"| {name} | {refusal(contender)} | - | - | - | - | - |")
            continue
        low, peak, high = harness.stats([r["peak_mb"] for r in contender])
        rate_low, rate, rate_high = harness.stats([r["throughput"] for r in contender])
        versus = (f"{peak / base_peak:.2f}", f"{rate / base_rate:.2f}") if base_peak else ("-", "-")
        lines.append(f"| {name} | {peak:,.0f} ({low:,.0f}-{high:,.0f}) | {versus[0]} | {rate:.2f} "
                     f"({rate_low:.2f}-{rate_high:.2f}) | {versus[1]} | {contender[0]['loss']:.4f} | "
                     f"{statistics.median(r['estimate_mb'] for r in contender) / peak:.2f} |")
    return "\n".join(lines + ["", "Where the time went (medians of the rounds):", "", time_table(trained)])


def quantized(args, path, model):
    int8 = path + "-int8"
    saved = role("save-quantized", "--path", path, "--quantized-path", int8)
    common = ["--size", args.size, "--steps", str(args.steps)]

    def contender(which, mode):
        extra = ["--path", int8 if which == "int8" else path] + (["--quantize", mode] if mode else [])
        return lambda: (harness.settle(), role("tfbarrier", *common, *extra))[1]

    runs = harness.rounds_of({name: contender(*spec) for name, spec in QUANTIZED.items()}, args.rounds, log=print)
    harness.write_section(f"quantized-lora-{args.size}", quantized_section(args, model, saved, runs))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="120m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--quantized", action="store_true", help="float32 against int8 LoRA fits, side by side")
    parser.add_argument("--role")
    parser.add_argument("--path")
    parser.add_argument("--quantize")
    parser.add_argument("--quantized-path")
    parser.add_argument("--model-object", action="store_true",
                        help="also fit the preset loaded on the driver, as a model object (issue 74, item 4)")
    args = parser.parse_args()
    if args.role:
        return {"save": lambda: save(args.size, args.path), "plain": lambda: plain(args.size, args.path, args.steps),
                "save-quantized": lambda: save_quantized(args.path, args.quantized_path),
                "tfbarrier": lambda: distributed(args.size, args.path, args.steps, args.quantize),
                "tfbarrier-object": lambda: distributed(args.size, args.path, args.steps, model_object=True),
                }[args.role]()
    path = os.path.join(harness.scratch_dir("tfbarrier-bench-preset-"), "preset")
    common = ["--size", args.size, "--path", path, "--steps", str(args.steps)]
    model = role("save", *common)
    if args.quantized:
        return quantized(args, path, model)
    contenders = ["plain", "tfbarrier"] + (["tfbarrier-object"] if args.model_object else [])
    runs = harness.rounds_of({name: functools.partial(lambda name: (harness.settle(), role(name, *common))[1], name)
                              for name in contenders}, args.rounds, log=print)
    harness.write_section(f"preset-{args.size}" + ("-model-object" if args.model_object else ""),
                          section(args, model, runs))


if __name__ == "__main__":
    main()
