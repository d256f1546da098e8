"""Driver program for test_presets: a preset named by its Hugging Face handle (hf://org/name), which each training
process resolves through KerasHub into its host's Hugging Face cache. No network here: the cache is filled by this
program (huggingface_hub's layout: refs/main names a snapshot) and the hub is offline (HF_HUB_OFFLINE=1), as on a
cluster whose executors share a cache. Its own Spark, started after the cache's settings so that the executors
have them. Prints one JSON line."""

import atexit
import json
import os
import shutil
import tempfile

import test_text
from conftest import make_spark, partitioned
from test_presets import compile_for_test

import tfbarrier

root = tempfile.mkdtemp(prefix="tfbarrier-hub-")
atexit.register(shutil.rmtree, root, True)  # however the program ends
os.environ.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=os.path.join(root, "hf"))
HANDLE, REPO = "hf://tfbarrier-tests/tiny_gpt2", "models--tfbarrier-tests--tiny_gpt2"
directory = os.path.join(root, "preset")
test_text.causal_lm().save_to_preset(directory)
commit = "0123456789abcdef0123456789abcdef01234567"
shutil.copytree(directory, os.path.join(root, "hf", REPO, "snapshots", commit))
os.makedirs(os.path.join(root, "hf", REPO, "refs"))
with open(os.path.join(root, "hf", REPO, "refs", "main"), "w") as f:
    f.write(commit)

spark = make_spark("local[2]")
rows = test_text.ROWS_PER_WORKER
df = partitioned(spark, test_text.phrases(2 * rows, seed=4), lambda i: int(i >= rows), 2)
report = {}
for name, path in (("handle", HANDLE), ("directory", directory)):
    result = tfbarrier.fit(df, tfbarrier.preset(path, lora_rank=2, prepare=compile_for_test), features="text",
                           epochs=1, batch_size=test_text.GLOBAL_BATCH, num_workers=2, shuffle=False, seed=11,
                           verbose=0)
    report[name] = {"loss": result.history["loss"], "preset": result.model.preset,
                    "adapters": [w.numpy().tolist() for w in result.model.load().backbone.trainable_weights]}
try:
    tfbarrier.fit(df, tfbarrier.preset("hf://tfbarrier-tests/not_cached", lora_rank=2), features="text", epochs=1,
                  num_workers=2, verbose=0, max_retries=0)
except Exception as exc:  # noqa: B902 - what the user sees
    report["missing"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(report), flush=True)
spark.stop()
