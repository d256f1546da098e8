"""A KerasHub preset loaded where it trains: the driver ships its path, never its weights; each training process
loads it, enables the LoRA adapters, and only they come back."""

import gc
import hashlib
import json
import os
import re

import keras
import numpy as np
import pandas as pd
import pytest
import tf_keras
from conftest import partitioned, run_driver
from support.peak_memory import PeakMemory
from test_sequence_labels import GLOBAL_BATCH, ROWS_PER_WORKER as ROWS, causal_lm, frame_of, in_global_batches, \
    sequences
from test_tracking import tracking_to

import tfbarrier
from tfbarrier.errors import InvalidArgumentError, ModelError
from tfbarrier.models import presets, quantized
from tfbarrier.models.presets import LoraAdapters

FEATURES = {"token_ids": "ids", "padding_mask": "mask"}


def compile_for_test(model):
    """prepare=: what each training process does with the loaded task (a module-level function: it is pickled)."""
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class FrozenDigests(tf_keras.callbacks.Callback):  # Keras 3's fit takes tf_keras's callbacks too
    """In each training process, once it trained: the SHA-256 of every weight it holds frozen, by path, written to
    ``<out>/worker-<index>.json``: what the workers ended with, not what a later load of the preset reads."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def on_train_end(self, logs=None):
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        frozen = {w.path: hashlib.sha256(np.asarray(w.numpy()).tobytes()).hexdigest()
                  for w in self.model.weights if not w.trainable}
        with open(os.path.join(self.out, f"worker-{index}.json"), "w") as f:
            json.dump(frozen, f)


@pytest.fixture(scope="module")
def saved_preset(tmp_path_factory):
    """A small Llama-architecture causal LM built from a config and saved as a preset directory (no download)."""
    path = str(tmp_path_factory.mktemp("preset") / "tiny_llama")
    causal_lm().save_to_preset(path)
    return path


def test_a_lora_fine_tune_of_a_preset_loaded_by_the_workers_equals_one_process(spark, saved_preset, tmp_path):
    data = sequences(2 * ROWS, seed=7)
    df = partitioned(spark, frame_of(data), lambda i: int(i >= ROWS), 2)
    out = str(tmp_path)
    result = tfbarrier.fit(df, tfbarrier.preset(saved_preset, lora_rank=2, prepare=compile_for_test),
                           features=FEATURES, label="labels", sample_weight="weights", epochs=2,
                           batch_size=GLOBAL_BATCH, num_workers=2, shuffle=False, seed=11, verbose=0,
                           callbacks=lambda: [FrozenDigests(out)])

    import keras_hub

    keras.utils.set_random_seed(11)  # as each training process, before it loads the preset
    reference = keras_hub.models.CausalLM.from_preset(saved_preset)
    reference.backbone.enable_lora(2)
    compile_for_test(reference)
    ordered = in_global_batches(data)
    history = reference.fit({name: ordered[column] for name, column in FEATURES.items()}, ordered["labels"],
                            sample_weight=ordered["weights"], batch_size=GLOBAL_BATCH, epochs=2, shuffle=False,
                            verbose=0).history
    np.testing.assert_allclose(result.history["loss"], history["loss"], rtol=1e-4)

    adapters = result.model  # only the adapters came back: a few KB, not the backbone
    assert isinstance(adapters, LoraAdapters) and adapters.rank == 2
    trained = adapters.load()
    initial = keras_hub.models.CausalLM.from_preset(saved_preset)
    by_path = {w.path: w for w in trained.weights}
    for weight in reference.backbone.trainable_weights:
        assert "lora" in weight.path
        np.testing.assert_allclose(by_path[weight.path].numpy(), weight.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=weight.path)
    for weight in initial.weights:  # the adapters' file puts back no frozen weight of its own
        np.testing.assert_array_equal(by_path[weight.path].numpy(), weight.numpy(), err_msg=weight.path)
    frozen = {w.path for w in reference.weights if not w.trainable}
    preset = {w.path: hashlib.sha256(np.asarray(w.numpy()).tobytes()).hexdigest() for w in initial.weights}
    assert frozen and frozen <= set(preset)
    for worker in (0, 1):  # what each training process ended with: every frozen weight as the preset has it
        with open(tmp_path / f"worker-{worker}.json") as f:
            held = json.load(f)
        assert set(held) == frozen, f"worker {worker} froze {sorted(set(held) ^ frozen)} otherwise"
        assert held == {path: preset[path] for path in frozen}, f"worker {worker} changed a frozen weight"
    moved = max(np.abs(w.numpy()).max() for w in reference.backbone.trainable_weights if "lora_kernel_b" in w.path)
    assert moved > 1e-3  # lora_kernel_b starts at zeros: the adapters trained
    sent = max(w["communication"]["bytes_sent"] for w in result.workers)
    assert sent < sum(np.asarray(w.numpy(), "float32").nbytes for w in initial.weights)


def test_the_driver_never_holds_a_presets_weights_while_it_fits(spark, tmp_path):
    """The driver ships the preset's path: its resident memory, sampled through the fit, stays far below the weights
    (a backbone built and freed on the driver during the fit would show here, not in a count afterwards)."""
    keras_hub = pytest.importorskip("keras_hub")
    path = str(tmp_path / "wide_llama")
    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.LlamaBackbone(vocabulary_size=32, num_layers=1, num_query_heads=2, num_key_value_heads=1,
                                              hidden_dim=256, intermediate_dim=65536)  # a 200 MB MLP, little compute
    keras_hub.models.LlamaCausalLM(backbone, preprocessor=None).save_to_preset(path)
    weights = os.path.getsize(os.path.join(path, "model.weights.h5"))
    del backbone
    data = sequences(2 * ROWS, seed=7)
    df = partitioned(spark, frame_of(data), lambda i: int(i >= ROWS), 2)
    gc.collect()
    with PeakMemory() as memory:
        result = tfbarrier.fit(df, tfbarrier.preset(path, lora_rank=2, prepare=compile_for_test), features=FEATURES,
                               label="labels", epochs=1, batch_size=GLOBAL_BATCH, num_workers=2, verbose=0)
    assert isinstance(result.model, LoraAdapters) and np.isfinite(result.history["loss"]).all()
    assert weights > 150 * 2**20 and memory.growth < weights / 4, (
        f"the driver grew by {memory.growth / 2**20:.0f} MB during the fit of a {weights / 2**20:.0f} MB preset")


def test_a_preset_is_refused_on_the_driver_when_it_is_no_task_or_with_a_text_column(spark, saved_preset, tmp_path):
    backbone_only = str(tmp_path / "backbone")
    keras_hub = pytest.importorskip("keras_hub")
    keras_hub.models.CausalLM.from_preset(saved_preset).backbone.save_to_preset(backbone_only)
    df = spark.createDataFrame(frame_of(sequences(4, seed=1)))
    with pytest.raises(ModelError, match="has no task.json"):
        tfbarrier.fit(df, backbone_only, features=FEATURES, label="labels", num_workers=1)
    text = spark.createDataFrame([("a b c",)], "text string")  # the preset was saved without a preprocessor
    with pytest.raises(ModelError, match=r"holds strings, but the preset .* has no preprocessor.json"):
        tfbarrier.fit(text, saved_preset, features="text", num_workers=1)
    with pytest.raises(InvalidArgumentError, match="lora_rank must be a positive integer"):
        tfbarrier.preset(saved_preset, lora_rank=0)
    with pytest.raises(InvalidArgumentError, match="quantize must be one of 'int8', 'int4'"):
        tfbarrier.preset(saved_preset, lora_rank=2, quantize="int3")
    with pytest.raises(InvalidArgumentError, match="only LoRA adapters can train over them; give lora_rank"):
        tfbarrier.preset(saved_preset, quantize="int8")


def test_a_preset_saved_quantized_loads_quantized_and_refuses_another_mode(saved_preset, tmp_path):
    """A preset quantized once and saved loads with its layers built in int8 (no float copy of its weights made to be
    quantized again), its layers computing from float inputs (Keras's preset gives them back its default int8, which
    quantizes the inputs too: a third of float's speed); asked for another mode, it is refused in words."""
    import keras_hub

    task = keras_hub.models.CausalLM.from_preset(saved_preset)
    task.quantize("int8")
    int8 = str(tmp_path / "int8")
    task.save_to_preset(int8)
    loaded = presets.load_task(int8, quantize="int8")
    kernels = [w for w in loaded.backbone.weights if w.path.endswith("/kernel")]
    assert kernels and all(w.dtype == "int8" for w in kernels), [(w.path, w.dtype) for w in kernels]
    int8_layers = [layer for layer in loaded.backbone._flatten_layers()
                   if getattr(layer, "quantization_mode", None) == "int8" and hasattr(layer, "inputs_quantizer")]
    assert int8_layers and all(layer.inputs_quantizer is None for layer in int8_layers)
    by_path = {w.path: w for w in task.backbone.weights}
    for weight in loaded.backbone.weights:
        np.testing.assert_array_equal(weight.numpy(), by_path[weight.path].numpy(), err_msg=weight.path)
    with pytest.raises(ModelError, match="was saved quantized to int8, not int4"):
        presets.load_task(int8, quantize="int4")
    assert quantized.mode_of(presets.load_task(saved_preset).backbone) is None


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_a_lora_fine_tune_of_a_preset_from_a_text_column_equals_one_process_and_generates_on_the_executors(
        spark, tmp_path, quantize):
    """The preset's own preprocessor, loaded with it by each training process, makes the token ids, the next-token
    labels and their mask from a string column; save_to's preset keeps it. (Before: "does not take a text column
    yet".) With quantize="int8", each process holds the backbone's weights in int8 and trains the adapters over
    them as one process does (QLoRA's idea): the same losses, adapters and generated text."""
    import keras_hub
    import test_text

    path = str(tmp_path / "tiny_gpt2")
    test_text.causal_lm().save_to_preset(path)  # a GPT-2 task with its byte-pair tokenizer
    rows = test_text.ROWS_PER_WORKER  # a local: the partitioning function travels to the executors
    data = test_text.phrases(2 * rows, seed=4)
    df = partitioned(spark, data, lambda i: int(i >= rows), 2)
    result = tfbarrier.fit(df, tfbarrier.preset(path, lora_rank=2, prepare=compile_for_test, quantize=quantize),
                           features="text", epochs=2, batch_size=test_text.GLOBAL_BATCH, num_workers=2, shuffle=False,
                           seed=11, verbose=0, save_to=str(tmp_path / "saved"))

    keras.utils.set_random_seed(11)
    reference = keras_hub.models.CausalLM.from_preset(path)
    if quantize:  # weight-only, as tfbarrier computes (quantized.py): the inputs stay in float
        reference.backbone.quantize(quantize, config=keras.quantizers.Int8QuantizationConfig(activation_quantizer=None))
    reference.backbone.enable_lora(2)
    compile_for_test(reference)
    history = reference.fit(test_text.in_global_batches(data)["text"].to_numpy(), batch_size=test_text.GLOBAL_BATCH,
                            epochs=2, shuffle=False, verbose=0).history
    np.testing.assert_allclose(result.history["loss"], history["loss"], rtol=1e-4)
    assert isinstance(result.model, LoraAdapters)
    trained = {w.path: w for w in result.model.load().weights}
    # enable_lora leaves the attention's biases trainable, and save_lora_weights leaves them out: they came back too
    assert any(not w.path.endswith(("lora_kernel_a", "lora_kernel_b")) for w in reference.trainable_weights)
    for weight in reference.trainable_weights:
        np.testing.assert_allclose(trained[weight.path].numpy(), weight.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=weight.path)
    saved = keras_hub.models.CausalLM.from_preset(result.saved[-1]["path"])
    assert saved.preprocessor is not None, result.saved
    kernel = trained["transformer_layer_0/self_attention/query/kernel"]  # the adapters on the backbone, loaded here
    assert (kernel.dtype == "int8") == (quantize == "int8"), kernel.dtype
    assert quantized.mode_of(saved.backbone) == quantize  # save_to's preset is in the mode it trained in

    prompts = pd.DataFrame({"prompt": ["ab", "cd e", "h", "fgh fg"]})
    generated = tfbarrier.predict(partitioned(spark, prompts, lambda i: i % 2, 2), result, features="prompt",
                                  output="text", max_length=10, batch_size=2).toPandas()
    reference.compile(sampler="greedy")
    assert generated["prediction"].tolist() == reference.generate(generated["prompt"].tolist(), max_length=10)


def test_a_preset_no_executor_can_read_is_refused_with_its_path_and_host(spark):
    missing = "/nonexistent/tfbarrier-preset"
    assert not os.path.exists(missing)
    df = spark.createDataFrame(frame_of(sequences(4, seed=1)))
    with pytest.raises(ModelError, match=r"cannot be read on \S+: every executor must see it"):
        tfbarrier.fit(df, tfbarrier.preset(missing, lora_rank=2), features=FEATURES, label="labels", num_workers=1,
                      verbose=0, max_retries=0)


@pytest.fixture(scope="module")
def unseeded(spark, saved_preset, tmp_path_factory):
    """A LoRA fit of the preset with no seed, logged to the experiment "presets" of a local MLflow store and saved
    (save_to=); (the result, its rows as a DataFrame, the store's directory)."""
    data = sequences(2 * ROWS, seed=8)
    df = partitioned(spark, frame_of(data), lambda i: int(i >= ROWS), 2)
    store = tmp_path_factory.mktemp("mlflow")
    with tracking_to(store):
        result = tfbarrier.fit(df, tfbarrier.preset(saved_preset, lora_rank=2, prepare=compile_for_test),
                               features=FEATURES, label="labels", sample_weight="weights", epochs=1,
                               batch_size=GLOBAL_BATCH, num_workers=2, verbose=0, mlflow="presets",
                               save_to=str(tmp_path_factory.mktemp("saved")))
    return result, df, store


def test_without_a_seed_every_worker_starts_from_the_chiefs_adapters(unseeded):
    """Each training process draws its adapters at random when it enables them: without the chief's values sent to
    every worker first, the replicas trained apart (ReplicasDivergedError, the checksums of the two workers)."""
    result, _, _ = unseeded
    assert len({w["checksum"] for w in result.workers}) == 1
    assert np.isfinite(result.history["loss"]).all()


def test_the_adapters_score_on_the_executors_which_load_the_preset_themselves(spark, unseeded):
    """predict takes the fit (or its LoraAdapters) as it is: only the adapters travel to the executors, which load
    the preset and put them on it; the scores are the trained task's. (Before, predict refused LoraAdapters:
    "model must be a Keras model or a FitResult".)"""
    from tfbarrier.predicting.scoring_models import scoring_model

    result, df, _ = unseeded
    adapters = result.model
    shipped = scoring_model(spark, adapters.load(weights=False), adapters)
    assert shipped["payload"].size == len(adapters.weights)  # the adapters' file, not the backbone's weights
    scored = tfbarrier.predict(df, result, features=FEATURES, output="raw").toPandas()
    rows = {name: np.stack(scored[column]) for name, column in FEATURES.items()}  # the rows as they came back
    expected = np.asarray(adapters.load().predict(rows, verbose=0))
    got = np.stack(scored["prediction"])
    np.testing.assert_allclose(got, expected.reshape(len(expected), -1), rtol=1e-4, atol=1e-5)
    local = tfbarrier.predict_local(adapters, scored[list(FEATURES.values())], features=FEATURES, output="raw")
    np.testing.assert_allclose(np.asarray(local).reshape(len(got), -1), got, rtol=1e-4, atol=1e-5)


def test_save_to_writes_a_preset_directory_that_from_preset_loads_with_the_adapters_merged(unseeded):
    """(Before, save_to= wrote the LoRA task's .keras archive, epoch-001.keras, which from_preset cannot load.)"""
    import keras_hub

    result, df, _ = unseeded
    (saved,) = result.saved
    assert saved["epoch"] == 1 and os.path.basename(saved["path"]) == "epoch-001", saved
    loaded = keras_hub.models.CausalLM.from_preset(saved["path"])
    assert not any("lora" in w.path for w in loaded.weights)  # a plain task: its adapters are in its kernels
    rows = df.toPandas()
    inputs = {name: np.stack(rows[column]) for name, column in FEATURES.items()}
    expected = np.asarray(result.model.load().predict(inputs, verbose=0))
    np.testing.assert_allclose(np.asarray(loaded.predict(inputs, verbose=0)), expected, rtol=1e-4, atol=1e-5)


def test_a_preset_whose_weights_no_worker_can_hold_is_refused_on_the_driver_before_any_job(spark, saved_preset,
                                                                                           tmp_path):
    """The driver counts a preset's weights files (here made 1 TB, sparse: no disk taken, never loaded) against what
    a worker can have, before any Spark job. (Before, it counted nothing of a preset: each training process loaded
    the preset, to be refused on its host or killed for memory, retried on every attempt.)"""
    import shutil

    from test_memory import last_job_id

    large = str(tmp_path / "large_llama")
    shutil.copytree(saved_preset, large)
    os.truncate(os.path.join(large, "model.weights.h5"), 2**40)
    df = spark.createDataFrame(frame_of(sequences(4, seed=1)))
    before = last_job_id(spark)
    refused = r"needs about 10\d\d\.\d\d GB .*frozen weights 1024\.\d\d GB"
    with pytest.raises(ModelError, match=refused):
        tfbarrier.fit(df, tfbarrier.preset(large, lora_rank=2), features=FEATURES, label="labels", num_workers=1,
                      verbose=0)
    assert last_job_id(spark) == before + 1, "Spark ran a job before the refusal"


def test_the_fits_mlflow_run_keeps_the_adapters_and_names_their_preset(unseeded, saved_preset, tmp_path):
    """The run's model is the adapters' file, tagged with the preset they go on. (Before, logging the model failed
    with a TrackingWarning, "the trained model" not taken: MLflow has no flavor for LoraAdapters.)"""
    result, _, store = unseeded
    with tracking_to(store) as client:
        run = client.get_run(result.mlflow_run_id)
        logged = client.download_artifacts(run.info.run_id, "model/adapters.lora.h5", str(tmp_path))
    assert run.info.status == "FINISHED"
    with open(logged, "rb") as f:
        assert f.read() == result.model.weights
    tags = run.data.tags
    assert tags["tfbarrier.preset"] == saved_preset and tags["tfbarrier.lora_rank"] == "2"
    assert tags["tfbarrier.preset_task"] == result.model.task


def test_a_training_process_counts_what_a_presets_steps_keep_from_its_shards_widths(saved_preset):
    """The driver has no preset model to trace: the training process, which loaded it, traces it from its shard's
    widths before the check on its host (before, it counted nothing of a step's tensors for a preset's model)."""
    from types import SimpleNamespace

    import keras_hub

    from tfbarrier.models import memory
    from tfbarrier.models.presets import PresetModel

    loaded = keras_hub.models.CausalLM.from_preset(saved_preset)
    loaded.backbone.enable_lora(2)
    job = SimpleNamespace(model=PresetModel(saved_preset, lora_rank=2), exchange=None)
    size = memory.ModelSize.of_trained(loaded, job, {"token_ids": 64, "padding_mask": 64})
    assert size.native and size.kept is not None and size.kept[0] > 0
    untraced = memory.ModelSize.of(loaded, native=True)
    assert size.worker_bytes(32) - untraced.worker_bytes(32) >= 32 * size.kept[0]


def test_a_preset_named_by_its_hugging_face_handle_is_downloaded_by_each_training_process():
    """hf:// handles reach the training processes as they are: each resolves it through KerasHub into its host's
    cache (here filled by the driver program, the hub offline), and fits as from the same preset's directory; a
    handle no executor can download is refused naming it and the host. (Before: "cannot be read on <host>".)"""
    report = run_driver("hub_presets.py")
    handle, directory = report["handle"], report["directory"]
    assert handle["preset"].startswith("hf://") and not directory["preset"].startswith("hf://")
    np.testing.assert_allclose(handle["loss"], directory["loss"], rtol=1e-6)
    for by_handle, by_directory in zip(handle["adapters"], directory["adapters"]):
        np.testing.assert_allclose(by_handle, by_directory, rtol=1e-6)
    assert re.search(r"the preset 'hf://tfbarrier-tests/not_cached' cannot be downloaded or loaded on \S+ .*: every executor "
                     r"must reach its hub or find it in its cache", report["missing"]), report["missing"]
