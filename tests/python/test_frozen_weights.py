"""Frozen weights cost nothing extra over the ring: a fine-tune's frozen layers are the same on every worker,
so at each epoch's end only their checksums cross the ring; the variables that change without gradients
(BatchNormalization's moving statistics, different on each worker's rows) are still averaged. A LoRA-enabled
KerasHub model, whose archive would lose its adapters, is refused before any job."""

import keras
import numpy as np
import pandas as pd
import pytest
from conftest import partitioned

import tfbarrier
from tfbarrier.errors import ModelError

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


def test_a_lora_enabled_kerashub_model_is_refused_before_any_job_not_trained_whole(spark):
    # Its .keras archive rebuilds the backbone from its settings: without this refusal every worker trained all of
    # its weights (the loss went 1.90, 1.51 against 2.06, 2.06 for the adapters alone) and no adapter came back.
    from test_sequence_labels import causal_lm, frame_of, sequences

    model = causal_lm()
    model.backbone.enable_lora(rank=2)
    df = spark.createDataFrame(frame_of(sequences(16, seed=5)))
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(ModelError, match=r"llama_backbone has LoRA enabled \(enable_lora\), which a \.keras archive "
                                         r"does not keep.*fit it without enable_lora\(\)"):
        tfbarrier.fit(df, model, features={"token_ids": "ids", "padding_mask": "mask"}, label="labels", num_workers=2)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs
