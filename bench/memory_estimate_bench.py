"""The memory check's estimate (memory.py) against the peak a training process really reaches.

Real 2-worker ``tfbarrier.fit`` calls on local[2] (Spark's default memory, ``spark.tfbarrier.memoryCheck``
off so that every model trains), 4 steps of global batch 64, each model's fits in a driver of their
own: Dense-heavy MLPs (input 1024, two hidden layers: 12, 61, 150 and 300 M parameters; deep65 below) and
conv-heavy CNNs (64x64x3 images, four convolutions of 64-128 or 128-256 filters: little weight, much activation),
each with plain SGD, SGD with momentum and Adam. memory.py's constants were fitted on these peaks: the strategy's
at ec8e299 (mlp150's SGD row first run after them), the ring's step on the peaks of a run at 63fde93, then checked
by the next run, and split into copies of the weights and of the largest variable on deep65's (issue 74). A training
process reports its peak resident memory (``ru_maxrss``: it includes TensorFlow itself) in
``FitResult.workers[i]["memory"]``; the row takes the larger of the two workers', against
``memory.ModelSize.worker_bytes``, what the check on the driver compares with what a worker can have.
The target (issue 43): the estimate within 15% above the peak and never more than 5% below it.

``--baseline-ref REF`` (issue 59): each model's fits also run with revision REF's tfbarrier, in turn, and a second
table sets the peaks side by side: what a step's copies of the weights cost before and after (the difference in
copies of the trainable weights, for models of at least TELLING_MB of them).

``--models text`` (issue 74): a GPT-2 causal LM of about 43 M parameters fitted, every weight, from a string
column its preprocessor tokenizes (128 tokens a row), traced at that length.

``--sharded`` (issue 74): the fits shard the optimizer's state over the workers (``communication={"shard":
"optimizer"}``), the estimate the check's for that (``ModelSize.sharded``).

Warm start is off (``spark.tfbarrier.warmStart=false``; since issue 74, before it for ``--sharded`` only), so
every fit's training processes import TensorFlow themselves, as the estimate counts it (a process forked warm
from a keeper holds less of it). Each row says how many of its fits' workers were forked warm.

``deep65`` (issue 74): 65 M parameters in 16 hidden layers of 2048 (no matrix over 6% of them), where the
step's copies of the largest variable are small beside its weights and gradients.

``--models lora --optimizers adam --section=-lora`` (issue 60): a LoRA fine-tune, a Llama-architecture causal LM
of about 120 M parameters built from a config (no download) with rank-4 adapters on its attention, trained from
token id columns, its own section of bench/README.md.

    .venv/bin/python bench/memory_estimate_bench.py [--rounds 2] [--models cnn mlp61 ...] [--optimizers sgd adam]
        [--baseline-ref REF] [--section=-lora] [--sharded]
"""

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import harness  # noqa: E402

harness.local_spark_env()

ROWS, BATCH, STEPS, WORKERS = 256, 64, 4, 2
HIDDEN = {"mlp12": 3000, "mlp61": 7310, "mlp150": 11800, "mlp300": 16810}  # units of the two hidden layers
DEEP = {"deep65": (2048, 16)}  # (units, hidden layers): 65 M parameters, no matrix over 6% of them
SHAPES = {**{name: (1024,) for name in [*HIDDEN, *DEEP]}, "cnn": (64, 64, 3), "cnn-wide": (64, 64, 3)}
SEQUENCE, VOCABULARY = 64, 8192  # the LoRA model's rows: 64 token ids each
TEXT_SEQUENCE = 128  # the text model's preprocessor's sequence_length
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park", "it", "was", "sunny", "and", "warm"]
OPTIMIZERS = ("sgd", "momentum", "adam")
TOO_LARGE = {("mlp300", "adam")}  # two workers would need about 18 GB of this machine's 24
TELLING_MB = 100  # trainable weights below this: a copy of them is within a process's noise, none is reckoned


def lora_model():
    """A Llama-architecture causal LM of about 120 M parameters, its backbone frozen but for rank-4 adapters."""
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(vocabulary_size=VOCABULARY, num_layers=8, num_query_heads=8,
                                              num_key_value_heads=8, hidden_dim=1024, intermediate_dim=2816)
    model = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    backbone.enable_lora(4)
    return model


def text_model():
    """A GPT-2 causal LM of about 43 M parameters (6 layers of 768) with its preprocessor (a byte-pair tokenizer of
    about a character a token, built in place), every weight trained: fitted from a string column."""
    import keras_hub

    vocabulary = {"Ġ": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}}
    vocabulary["ab"] = len(vocabulary)  # one merge (an empty merge table cannot be made)
    vocabulary["<|endoftext|>"] = len(vocabulary)
    tokenizer = keras_hub.tokenizers.GPT2Tokenizer(vocabulary=vocabulary, merges=["a b"])
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=TEXT_SEQUENCE)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=len(vocabulary), num_layers=6, num_heads=12,
                                             hidden_dim=768, intermediate_dim=3072, max_sequence_length=TEXT_SEQUENCE,
                                             dropout=0.0)
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor)


def build(keras, name, optimizer):
    layers = keras.layers
    if name == "lora":
        model = lora_model()
    elif name == "text":
        model = text_model()
    elif name in HIDDEN or name in DEEP:
        units, hidden = DEEP.get(name, (HIDDEN.get(name), 2))
        model = keras.Sequential([keras.Input(SHAPES[name]), *[layers.Dense(units, activation="relu")
                                                               for _ in range(hidden)], layers.Dense(10)])
    else:
        model = keras.Sequential([keras.Input(SHAPES[name])]
                                 + [layers.Conv2D(filters, 3, padding="same", activation="relu")
                                    for filters in ((128, 128, 256, 256) if name == "cnn-wide" else (64, 64, 128, 128))]
                                 + [layers.GlobalAveragePooling2D(), layers.Dense(10)])
    chosen = {"sgd": keras.optimizers.SGD(0.01), "momentum": keras.optimizers.SGD(0.01, momentum=0.9),
              "adam": keras.optimizers.Adam(1e-4)}[optimizer]
    model.compile(optimizer=chosen, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def frame(spark, name):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    if name == "text":  # phrases of 20-40 words: longer than the preprocessor's sequence, cut to it
        rows = {"text": [" ".join(rng.choice(WORDS, rng.integers(20, 40))) for _ in range(ROWS)]}
    elif name == "lora":  # token ids, their next tokens as labels, every position counted
        tokens = rng.integers(1, VOCABULARY, (ROWS, SEQUENCE + 1)).astype(np.int32)
        rows = {"ids": list(tokens[:, :-1]), "mask": list(np.ones((ROWS, SEQUENCE), np.int32)),
                "labels": list(tokens[:, 1:].astype(np.int64))}
    else:
        rows = {"x": list(rng.random((ROWS, int(np.prod(SHAPES[name]))), dtype=np.float32)),
                "y": rng.integers(0, 10, ROWS)}
    return spark.createDataFrame(pd.DataFrame(rows)).repartition(WORKERS).cache()


def columns(name):
    """fit's features and label for ``name``'s rows."""
    if name == "lora":
        return {"features": {"token_ids": "ids", "padding_mask": "mask"}, "label": "labels"}
    if name == "text":  # the preprocessor makes the labels
        return {"features": "text"}
    return {"features": "x", "label": "y"}


def estimated_size(model, name, sharded=False):
    """The check's size of ``model`` as fit makes it: the LoRA and text models train natively, what their steps
    keep traced once the data's widths are known (the text model's: its preprocessor's sequence length); the
    optimizer's slots shared by the workers where ``sharded``."""
    from tfbarrier.models import memory

    if name not in ("lora", "text"):
        size = memory.ModelSize.of(model)
        return size.sharded(WORKERS) if sharded else size
    widths = {None: TEXT_SEQUENCE} if name == "text" else {"token_ids": SEQUENCE, "padding_mask": SEQUENCE}
    shapes = memory.input_shapes(model, widths)
    return memory.ModelSize.of(model, native=True).with_widths(model, shapes)


def measure(df, name, optimizer, sharded=False):
    """One fit of ``name`` with ``optimizer`` (its optimizer's state sharded where ``sharded``): the larger worker's
    peak and the estimate, in MB."""
    import keras

    import tfbarrier

    harness.settle()
    model = build(keras, name, optimizer)
    size = estimated_size(model, name, sharded)
    estimate = size.worker_bytes(BATCH // WORKERS) / 2**20
    communication = {"shard": "optimizer"} if sharded else None
    result = tfbarrier.fit(df, model, **columns(name), batch_size=BATCH, epochs=1, steps_per_epoch=STEPS,
                           num_workers=WORKERS, verbose=0, communication=communication)
    peaks = [w["memory"]["peak_mb"] for w in result.workers]
    found = {"peak_mb": max(peaks), "estimate_mb": estimate, "parameters": model.count_params(),
             "weights_mb": size.weights / 2**20, "trainable_mb": size.trainable / 2**20,
             "memory": [w["memory"] for w in result.workers],
             "warm": sum(bool(w.get("warm_start")) for w in result.workers),
             "size": dataclasses.asdict(size)}
    print(f"{name}-{optimizer}: {json.dumps(found)}", flush=True)
    return found


def section(args, runs, before=None):
    extra = (f" --optimizers {' '.join(args.optimizers)}" if args.optimizers != list(OPTIMIZERS) else ""
             ) + (f" --baseline-ref {args.baseline_ref}" if args.baseline_ref else "") + (
             " --sharded" if args.sharded else "") + (
             f" --section={args.section}" if args.section else "")
    lines = [
        f"`.venv/bin/python bench/memory_estimate_bench.py --rounds {args.rounds} --models {' '.join(args.models)}"
        f"{extra}`: "
        f"2-worker fits on local[2], {STEPS} steps of global batch {BATCH}, memory check off; a training "
        "process's peak resident memory (the larger worker's, TensorFlow included; median (min-max) of the "
        "rounds) against the check's estimate (memory.py)"
        + (", the optimizer's state sharded over the 2 workers" if args.sharded else "")
        + ". Target: estimate / peak in 0.95-1.15.", "",
        "| model | parameters, weights | optimizer | peak MB | estimate MB | estimate / peak | workers forked warm |",
        "|---|---|---|---|---|---|---|"]
    for (name, optimizer), found in runs.items():
        low, mid, high = harness.stats([r["peak_mb"] for r in found])
        estimate = found[0]["estimate_mb"]
        trains = f", {found[0]['trainable_mb']:,.1f} MB trainable" if name in ("lora", "text") else ""
        lines.append(f"| {name} | {found[0]['parameters'] / 1e6:.1f} M, {found[0]['weights_mb']:,.0f} MB{trains} | "
                     f"{optimizer} | {mid:,.0f} ({low:,.0f}-{high:,.0f}) | {estimate:,.0f} | "
                     f"{estimate / mid:.2f} ({estimate / high:.2f}-{estimate / low:.2f}) | "
                     f"{sum(r.get('warm', 0) for r in found)} of {WORKERS * len(found)} |")
    if before:
        lines += ["", f"The same fits' peaks with {args.baseline_ref}'s tfbarrier (before), round by round in turn "
                  f"(medians); saved: the difference, in copies of the trainable weights from {TELLING_MB} MB of them.", "",
                  f"| model | trainable MB | optimizer | peak MB, {args.baseline_ref} | peak MB, this tree | "
                  "saved MB | saved, copies of the trainable weights |", "|---|---|---|---|---|---|---|"]
        for (name, optimizer), found in runs.items():
            old, new = (statistics.median(r["peak_mb"] for r in rounds) for rounds in (before[name, optimizer], found))
            trainable = found[0]["trainable_mb"]
            copies = f"{(old - new) / trainable:+.2f}" if trainable >= TELLING_MB else "-"
            lines.append(f"| {name} | {trainable:,.0f} | {optimizer} | {old:,.0f} | {new:,.0f} | {old - new:+,.0f} | "
                         f"{copies} |")
    return "\n".join(lines)


def driver(name, optimizers, sharded=False):
    """One model's fits, one per optimizer, in a driver process of its own (``--driver``): a driver
    keeps what TensorFlow's allocator once held, so the models of several sizes in one driver add up
    (11.7 GB of them, which the OOM killer ended). Prints a JSON line."""
    spark = harness.local_spark(**{"spark.tfbarrier.memoryCheck": "false", "spark.tfbarrier.warmStart": "false"})
    df = frame(spark, name)
    found = {optimizer: measure(df, name, optimizer, sharded) for optimizer in optimizers}
    print("RESULT " + json.dumps(found), flush=True)
    spark.stop()


def run_driver(name, optimizers, source=None, sharded=False):
    """``name``'s fits in a driver of their own, with ``source`` (an older revision's sources) first on its path."""
    output = subprocess.run([sys.executable, __file__, "--driver", name, "--optimizers", *optimizers]
                            + (["--sharded"] if sharded else []),
                            check=True, capture_output=True, text=True, env=harness.env_with_source(source)).stdout
    found = json.loads(next(line for line in output.splitlines() if line.startswith("RESULT "))[7:])
    print(name, {optimizer: (round(r["peak_mb"]), round(r["estimate_mb"])) for optimizer, r in found.items()},
          flush=True)
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["cnn", "cnn-wide", "mlp12", "mlp61", "mlp150", "mlp300"])
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS))
    parser.add_argument("--driver")
    parser.add_argument("--baseline-ref", help="also run this git revision's tfbarrier: the peaks before and after")
    parser.add_argument("--section", default="", help="a suffix of the bench/README.md section written")
    parser.add_argument("--sharded", action="store_true", help="shard the optimizer's state over the workers")
    args = parser.parse_args()
    if args.driver:
        return driver(args.driver, args.optimizers, args.sharded)
    runs = {(name, optimizer): [] for name in args.models for optimizer in args.optimizers
            if (name, optimizer) not in TOO_LARGE}
    before = {key: [] for key in runs} if args.baseline_ref else None
    # (where the peaks go, the sources the driver imports): the baseline's first, then this tree's, per model
    passes = ([(before, harness.worktree(args.baseline_ref))] if before is not None else []) + [(runs, None)]
    for _ in range(args.rounds):
        for name in args.models:
            optimizers = [optimizer for optimizer in args.optimizers if (name, optimizer) in runs]
            for kept, source in passes:
                for optimizer, found in run_driver(name, optimizers, source, args.sharded).items():
                    kept[(name, optimizer)].append(found)
    harness.write_section("memory-estimate" + args.section, section(args, runs, before))


if __name__ == "__main__":
    main()
