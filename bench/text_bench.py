"""Text in, text out (issue 61), side by side in one run: a small GPT-2 causal LM built from a config (a character
a token, no download).

Generation: tokens per second of ``tfbarrier.predict(output="text")`` on local[2] (2 partitions, greedy) against one
process's ``model.generate`` over the same prompts and batch size, interleaved round by round. Both produce the
same texts (greedy), so both count the same generated tokens (the outputs' tokens less the prompts'). The one
process runs in a process of its own, its generation traced by a first pass before the clock starts, as the Spark
contender's warm-up run does for its Python workers.

Tokenization's share of a fit: a 2-worker fit from the string column (the preprocessor runs in the training
processes) against the same fit from the same rows tokenized beforehand (token ids, padding mask, next tokens and
their mask as array columns), same model and steps; the share is 1 - (tokens' fit time / text's).

    .venv/bin/python bench/text_bench.py [--prompts 256] [--fit-rows 4096] [--rounds 3]
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

harness.local_spark_env()

CHARACTERS = "abcdefghijklmnopqrstuvwxyz"
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park", "it", "was", "sunny", "and", "warm"]
SEQUENCE_LENGTH = 64


def build():
    import keras
    import keras_hub

    keras.utils.set_random_seed(1)
    vocabulary = {"Ġ": 0, **{c: i + 1 for i, c in enumerate(CHARACTERS)}}
    vocabulary["ab"] = len(vocabulary)  # one merge (an empty merge table cannot be made)
    vocabulary["<|endoftext|>"] = len(vocabulary)  # not the padding id 0: a sampler stops at rows holding one
    tokenizer = keras_hub.tokenizers.GPT2Tokenizer(vocabulary=vocabulary, merges=["a b"])
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=SEQUENCE_LENGTH)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=len(vocabulary), num_layers=2, num_heads=4,
                                             hidden_dim=128, intermediate_dim=256, max_sequence_length=128,
                                             dropout=0.0)
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def texts(count, seed, words=(4, 12)):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(*words))) for _ in range(count)]


def generated_tokens(model, prompts, outputs):
    tokenize = model.preprocessor.tokenizer
    return sum(len(tokenize(out)) - len(tokenize(prompt)) for prompt, out in zip(prompts, outputs))


def one_process(path, prompts, max_length, batch_size):
    """The ``--one-process`` run: load, generate every prompt once (traces each batch shape), then time
    generating them again; prints JSON."""
    import keras

    model = keras.saving.load_model(path)
    model.compile(sampler="greedy")

    def generate():
        out = []
        for start in range(0, len(prompts), batch_size):
            out += model.generate(prompts[start:start + batch_size], max_length=max_length)
        return out

    generate()
    started = time.perf_counter()
    outputs = generate()
    seconds = time.perf_counter() - started
    print(json.dumps({"outputs": outputs, "seconds": seconds}), flush=True)


def generation_contenders(spark, model, path, args):
    import pandas as pd

    import tfbarrier

    prompts = texts(args.prompts, seed=2, words=(1, 4))
    df = spark.createDataFrame(pd.DataFrame({"prompt": prompts})).repartition(2).cache()
    df.count()
    command = [sys.executable, __file__, "--one-process", path, "--prompts", str(args.prompts),
               "--max-length", str(args.max_length), "--batch-size", str(args.batch_size)]

    def local():
        run = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        return {"outputs": dict(zip(prompts, run["outputs"])), "seconds": run["seconds"]}

    def executors():
        harness.settle()
        started = time.perf_counter()
        rows = tfbarrier.predict(df, model, features="prompt", output="text", output_col="out",
                                 max_length=args.max_length, batch_size=args.batch_size).collect()
        return {"outputs": {row.prompt: row.out for row in rows}, "seconds": time.perf_counter() - started}

    return prompts, {"model.generate (1 process)": local, "tfbarrier.predict(output=\"text\") (local[2])": executors}


def tokenized(model, frame):
    """The columns the preprocessor makes from ``frame``'s text: token ids, padding mask, next tokens, their mask."""
    import numpy as np

    x, y, weights = model.preprocessor(frame["text"].tolist())
    return frame.assign(token_ids=list(np.asarray(x["token_ids"])), padding_mask=list(np.asarray(x["padding_mask"])),
                        next_ids=list(np.asarray(y)), mask=list(np.asarray(weights).astype("float32")))


def fit_contenders(spark, model, args):
    import pandas as pd

    import tfbarrier

    frame = tokenized(model, pd.DataFrame({"text": texts(args.fit_rows, seed=3)}))
    frame["padding_mask"] = frame["padding_mask"].map(lambda mask: mask.astype("int32"))
    df = spark.createDataFrame(frame).repartition(2).cache()
    df.count()
    bare = model.preprocessor
    common = dict(epochs=1, batch_size=64, num_workers=2, shuffle=False)

    def from_text():
        return tfbarrier.fit(df.select("text"), model, features="text", **common)

    def from_tokens():
        model.preprocessor = None  # as KerasHub trains on token ids: the backbone's inputs, labels and mask
        try:
            return tfbarrier.fit(df.select("token_ids", "padding_mask", "next_ids", "mask"), model,
                                 features={"token_ids": "token_ids", "padding_mask": "padding_mask"},
                                 label="next_ids", sample_weight="mask", **common)
        finally:
            model.preprocessor = bare

    def timed(fit):
        def run():
            harness.settle()
            started = time.perf_counter()
            fit()
            return {"seconds": time.perf_counter() - started}
        return run

    return {"fit from the string column": timed(from_text), "fit from token id columns": timed(from_tokens)}


def section(args, generation, fits, tokens):
    local = "model.generate (1 process)"
    base = harness.stats([tokens / r["seconds"] for r in generation[local]])[1]
    lines = [f"`.venv/bin/python bench/text_bench.py --prompts {args.prompts} --fit-rows {args.fit_rows} "
             f"--rounds {args.rounds}`: a GPT-2 causal LM of 2 layers (hidden 128, a character a token), greedy "
             f"generation of {args.prompts} prompts up to {args.max_length} tokens, {args.batch_size} a call "
             f"({tokens:,} tokens generated, the same texts in every contender); after one warm-up run of each.", "",
             "| contender | min tokens/s | median tokens/s | max tokens/s | median / one process |", "|---|---|---|---|---|"]
    for name, rounds in generation.items():
        low, mid, high = harness.stats([tokens / r["seconds"] for r in rounds])
        lines.append(f"| {name} | {low:,.0f} | {mid:,.0f} | {high:,.0f} | {mid / base:.2f} |")
    text = harness.stats([r["seconds"] for r in fits["fit from the string column"]])
    ids = harness.stats([r["seconds"] for r in fits["fit from token id columns"]])
    lines += ["", f"A 2-worker fit of the same model on {args.fit_rows:,} texts (1 epoch, batch 64, sequence "
              f"length {SEQUENCE_LENGTH}), the call's seconds:", "",
              "| fit | min s | median s | max s |", "|---|---|---|---|",
              f"| from the string column (tokenized in the training processes) | {text[0]:.1f} | {text[1]:.1f} | {text[2]:.1f} |",
              f"| from token id columns (tokenized beforehand) | {ids[0]:.1f} | {ids[1]:.1f} | {ids[2]:.1f} |", "",
              f"Tokenization's share of the fit from text (medians): {1 - ids[1] / text[1]:.0%}."]
    return "## Text in, text out\n\n" + "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--fit-rows", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--one-process", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_process:
        return one_process(args.one_process, texts(args.prompts, seed=2, words=(1, 4)), args.max_length,
                           args.batch_size)

    spark = harness.local_spark(**{"spark.sql.shuffle.partitions": "2"})
    model = build()
    path = os.path.join(harness.scratch_dir(prefix="tfbarrier-bench-"), "lm.keras")
    model.save(path)
    prompts, runs = generation_contenders(spark, model, path, args)
    warm = {name: run() for name, run in runs.items()}  # warm-up: Python workers, model caches, traced generation
    assert warm["model.generate (1 process)"]["outputs"] == warm["tfbarrier.predict(output=\"text\") (local[2])"]["outputs"]
    tokens = generated_tokens(model, prompts, [warm["model.generate (1 process)"]["outputs"][p] for p in prompts])
    generation = harness.rounds_of(runs, args.rounds, lambda line: print(line[:200], flush=True))
    fits = fit_contenders(spark, model, args)
    for run in fits.values():  # warm-up: spares, traces
        run()
    fits = harness.rounds_of(fits, args.rounds, lambda line: print(line, flush=True))
    body = section(args, generation, fits, tokens)
    harness.write_section("text", body)
    print(body)
    spark.stop()


if __name__ == "__main__":
    main()
