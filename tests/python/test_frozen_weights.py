"""Frozen weights cost nothing extra over the ring: a fine-tune's frozen layers are the same on every worker,
so at each epoch's end only their checksums cross the ring; the variables that change without gradients
(BatchNormalization's moving statistics, different on each worker's rows) are still averaged. A LoRA fine-tune
of a KerasHub causal LM trains its adapters alone, as one process does."""

import functools

import keras
import numpy as np
import pandas as pd
import pytest
from conftest import partitioned

import tfbarrier

ROWS_PER_WORKER = 48
FEATURES = 64
FROZEN_UNITS = 2048


def frozen_model():
    keras.utils.set_random_seed(8)
    inputs = keras.Input((FEATURES,))
    normalized = keras.layers.BatchNormalization()(inputs)
    frozen = keras.layers.Dense(FROZEN_UNITS, activation="relu", trainable=False, name="frozen")(normalized)
    model = keras.Model(inputs, keras.layers.Dense(1)(frozen))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def test_frozen_weights_never_cross_the_ring_and_moving_statistics_are_averaged(spark):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2 * ROWS_PER_WORKER, FEATURES)).astype("float32")
    x[ROWS_PER_WORKER:] += 3.0  # worker 1's rows: its moving mean moves elsewhere than worker 0's
    frame = pd.DataFrame({"x": list(x), "y": x[:, :4].sum(axis=1)})
    df = partitioned(spark, frame, lambda i: int(i >= ROWS_PER_WORKER), 2)
    model = frozen_model()
    frozen = [w.numpy() for w in model.get_layer("frozen").weights]
    result = tfbarrier.fit(df, model, features="x", label="y", epochs=2, batch_size=16, num_workers=2)

    frozen_bytes = sum(w.nbytes for w in frozen)  # 532 KB; averaged in float64, 1 MB through the ring an epoch
    sent = [w["communication"]["bytes_sent"] for w in result.workers]
    assert max(sent) < frozen_bytes / 2, (sent, frozen_bytes)
    for trained, initial in zip(result.model.get_layer("frozen").get_weights(), frozen):
        np.testing.assert_array_equal(trained, initial)
    # each epoch (6 steps, momentum 0.99) worker 0's moving mean decays toward its rows' 0 and worker 1's moves toward
    # 3, from their mean at the epoch before: averaged, 0.171 after 2 epochs; worker 0's alone 0, worker 1's 0.34
    expected, decay = 0.0, 0.99 ** 6
    for _ in range(2):
        expected = (expected * decay + (expected * decay + 3 * (1 - decay))) / 2
    np.testing.assert_allclose(result.model.layers[1].moving_mean.numpy().mean(), expected, rtol=0.1)
    assert result.workers[0]["checksum"] == result.workers[1]["checksum"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_a_lora_fine_tune_of_a_kerashub_model_trains_only_its_adapters_as_one_process_does(spark, dtype):
    # A .keras archive rebuilds a KerasHub backbone from its settings, without the adapters or the weights they
    # froze: before tfbarrier restored them, every worker trained all of its weights (the loss went 1.90, 1.51
    # against the adapters' 2.06, 2.06 in one process) and no adapter came back.
    # bfloat16, KerasHub presets' usual dtype: the frozen backbone stays bfloat16 and Keras makes the adapters
    # float32. Before 2026-11-28 the trained weights could not be written ("ValueError: cannot include dtype 'E' in
    # a buffer": NumPy's bfloat16 has no buffer format).
    # int8: a model object quantized by its user (Keras's own int8, its inputs quantized too) trains as it computes
    # in one process, its layers dequantizing one at a time (quantized.py).
    from test_sequence_labels import GLOBAL_BATCH, ROWS_PER_WORKER as ROWS, causal_lm, frame_of, in_global_batches, \
        sequences

    def lora_model():
        model = causal_lm("float32" if dtype == "int8" else dtype)
        if dtype == "int8":
            model.backbone.quantize("int8")
        model.backbone.enable_lora(rank=2)
        # Adam moves a weight by its rate whatever the gradient's size: where bfloat16 rounds a near-zero gradient
        # to the other sign on one side (2 of 32 elements on an AMD EPYC without AVX-512), the sides end 2.5 rates
        # apart. Plain SGD moves each weight by its gradient, so the two sides stay as close as their gradients.
        optimizer = keras.optimizers.Adam(0.01) if dtype == "float32" else keras.optimizers.SGD(0.5)
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    model, reference = lora_model(), lora_model()
    frozen = {w.path: w.numpy() for w in model.non_trainable_weights}
    dtypes = {w.path: w.dtype for w in model.non_trainable_weights}  # int8: the kernels, and their scales float32
    assert dtype in dtypes.values()
    initial = {w.path: w.numpy() for w in model.trainable_weights}
    assert all("lora" in w.path for w in model.trainable_weights) and frozen
    data = sequences(2 * ROWS, seed=5)
    df = partitioned(spark, frame_of(data), lambda i: int(i >= ROWS), 2)
    features = {"token_ids": "ids", "padding_mask": "mask"}
    result = tfbarrier.fit(df, model, features=features, label="labels", sample_weight="weights", epochs=2,
                           batch_size=GLOBAL_BATCH, num_workers=2, shuffle=False)

    ordered = in_global_batches(data)
    history = reference.fit({name: ordered[column] for name, column in features.items()}, ordered["labels"],
                            sample_weight=ordered["weights"], batch_size=GLOBAL_BATCH, epochs=2, shuffle=False,
                            verbose=0).history
    np.testing.assert_allclose(result.history["loss"], history["loss"], rtol=1e-4)
    trained = {w.path: w for w in result.model.weights}
    assert sorted(w.path for w in result.model.trainable_weights) == sorted(w.path for w in model.trainable_weights)
    for path, value in frozen.items():
        assert trained[path].dtype == dtypes[path], path
        # Keras's own save of a LoRA-enabled quantized layer merges its adapters and quantizes again: the archive that
        # travels holds the query and value kernels' scales 3-4e-6 (relative) from the model's (as model.save does)
        compare = (functools.partial(np.testing.assert_allclose, rtol=1e-5) if dtype == "int8" and
                   path.endswith("_scale") else np.testing.assert_array_equal)
        compare(np.asarray(trained[path].numpy()), value, err_msg=path)
    for weight in reference.trainable_weights:  # the adapters, as one process trained them
        assert trained[weight.path].dtype == "float32"
        # bfloat16 activations keep 8 bits: two workers' gradients and one process's round apart (about 1e-3 of
        # the adapters' 0.1-0.3, which training moves by up to 0.08)
        tolerance = dict(rtol=1e-2, atol=5e-3) if dtype == "bfloat16" else dict(rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(trained[weight.path].numpy(), weight.numpy(), err_msg=weight.path, **tolerance)
    moved = max(np.abs(weight.numpy() - initial[weight.path]).max() for weight in reference.trainable_weights)
    assert moved > 10 * tolerance["atol"], moved  # the adapters trained: the comparison is not of their start
    sent = max(w["communication"]["bytes_sent"] for w in result.workers)
    # the backbone never crossed (what did: each step's adapter gradients, the logs, the checksums)
    assert sent < sum(np.asarray(value, "float32").nbytes for value in frozen.values())
