"""Sequence labels: a label column of arrays (a causal LM's next tokens, a value per position), weighed per
position by an array column of sample weights (the padding mask), as KerasHub trains a causal LM. A small
Llama-architecture causal LM built from a config, on 2 workers, ends with the loss, validation loss and
weights of one Keras 3 process fed the same global batches, and a tf_keras tagger (a class per position) those of
one tf_keras process; sequence columns that cannot work are refused on
the driver, before the barrier stage, naming the fix."""

import keras
import numpy as np
import pandas as pd
import pytest
import tf_keras
from conftest import partitioned

import tfbarrier
from tfbarrier.errors import ColumnError

ROWS_PER_WORKER = 24
GLOBAL_BATCH = 8
SEQUENCE = 8
VOCABULARY = 32


def causal_lm(dtype=None):
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.LlamaBackbone(vocabulary_size=VOCABULARY, num_layers=1, num_query_heads=2,
                                              num_key_value_heads=1, hidden_dim=16, intermediate_dim=32, dtype=dtype)
    model = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["sparse_categorical_accuracy"])
    return model


def sequences(rows, seed):
    """Token ids counting up from a random start (a pattern to learn), padded after a random length: the
    columns a causal LM trains from, labels the next tokens, the padding weighing nothing."""
    rng = np.random.default_rng(seed)
    starts, lengths = rng.integers(0, VOCABULARY, rows), rng.integers(3, SEQUENCE + 2, rows)
    tokens = (starts[:, None] + np.arange(SEQUENCE + 1)) % VOCABULARY
    present = np.arange(SEQUENCE + 1) < np.minimum(lengths, SEQUENCE + 1)[:, None]
    tokens = np.where(present, tokens, 0)
    return {"ids": tokens[:, :-1].astype("int32"), "mask": present[:, :-1].astype("int32"),
            "labels": tokens[:, 1:].astype("int64"), "weights": present[:, 1:].astype("float32")}


def frame_of(data):
    return pd.DataFrame({name: list(values) for name, values in data.items()})


def in_global_batches(data):
    """The rows in the order one process sees the 2 workers' global batches (half a batch each, no shuffle)."""
    half = GLOBAL_BATCH // 2
    order = np.concatenate([np.r_[i:i + half, ROWS_PER_WORKER + i:ROWS_PER_WORKER + i + half]
                            for i in range(0, ROWS_PER_WORKER, half)])
    return {name: values[order] for name, values in data.items()}


def test_a_causal_lm_fits_from_sequence_labels_as_one_process(spark):
    model, reference = causal_lm(), causal_lm()  # seeded: the same weights
    data, held_out = sequences(2 * ROWS_PER_WORKER, seed=1), sequences(GLOBAL_BATCH, seed=2)
    df = partitioned(spark, frame_of(data), lambda i: int(i >= ROWS_PER_WORKER), 2)
    validation = spark.createDataFrame(frame_of(held_out))
    result = tfbarrier.fit(df, model, features={"token_ids": "ids", "padding_mask": "mask"}, label="labels",
                           sample_weight="weights", validation_data=validation, epochs=3, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False)

    ordered = in_global_batches(data)
    history = reference.fit({"token_ids": ordered["ids"], "padding_mask": ordered["mask"]}, ordered["labels"],
                            sample_weight=ordered["weights"], batch_size=GLOBAL_BATCH, epochs=3, shuffle=False,
                            verbose=0).history
    np.testing.assert_allclose(result.history["loss"], history["loss"], rtol=1e-4)
    assert history["loss"][-1] < history["loss"][0]
    for trained, expected in zip(result.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(trained, expected, rtol=1e-3, atol=1e-3)
    evaluated = reference.evaluate({"token_ids": held_out["ids"], "padding_mask": held_out["mask"]},
                                   held_out["labels"], sample_weight=held_out["weights"], batch_size=GLOBAL_BATCH,
                                   return_dict=True, verbose=0)
    np.testing.assert_allclose(result.history["val_loss"][-1], evaluated["loss"], rtol=1e-4)
    np.testing.assert_allclose(result.history["val_sparse_categorical_accuracy"][-1],
                               evaluated["sparse_categorical_accuracy"], rtol=1e-5)


def tagger():
    tf_keras.utils.set_random_seed(4)
    model = tf_keras.Sequential([tf_keras.Input((SEQUENCE,), dtype="int32"), tf_keras.layers.Embedding(VOCABULARY, 8),
                                 tf_keras.layers.Dense(VOCABULARY)])
    model.compile(optimizer=tf_keras.optimizers.SGD(0.5),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_tf_keras_tagger_fits_and_validates_per_position_as_one_process(spark):
    model, reference = tagger(), tagger()
    data, held_out = sequences(2 * ROWS_PER_WORKER, seed=3), sequences(GLOBAL_BATCH, seed=4)
    df = partitioned(spark, frame_of(data), lambda i: int(i >= ROWS_PER_WORKER), 2)
    result = tfbarrier.fit(df, model, features="ids", label="labels", sample_weight="weights", epochs=2,
                           validation_data=spark.createDataFrame(frame_of(held_out)), batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False)

    ordered = in_global_batches(data)
    history = reference.fit(ordered["ids"], ordered["labels"], sample_weight=ordered["weights"], epochs=2,
                            batch_size=GLOBAL_BATCH, shuffle=False, verbose=0).history
    np.testing.assert_allclose(result.history["loss"], history["loss"], rtol=1e-4)
    evaluated = reference.evaluate(held_out["ids"], held_out["labels"], sample_weight=held_out["weights"],
                                   batch_size=GLOBAL_BATCH, verbose=0)
    np.testing.assert_allclose(result.history["val_loss"][-1], evaluated, rtol=1e-4)


def test_sequence_columns_that_cannot_train_are_refused_on_the_driver(spark):
    model = causal_lm()
    data = sequences(2 * ROWS_PER_WORKER, seed=1)
    ragged = frame_of(data)
    ragged.at[5, "labels"] = ragged.at[5, "labels"][:-2]
    nulls = frame_of(data)
    nulls.at[3, "weights"] = [None] * SEQUENCE
    cases = [  # the driver's profile says these (a task's own check words them otherwise)
        (ragged, "labels", {}, r"column 'labels' holds arrays of different lengths \(6 to 8\); a sequence label and "
                               r"its weights need one length: pad them"),
        (nulls, "labels", {"sample_weight": "weights"}, r"column 'weights' has 1 array\(s\) with null elements"),
        (frame_of(data).assign(labels=0), "labels", {"sample_weight": "weights"},
         r"holds an array per row, which weighs the positions of a sequence label.*give one weight per row"),
    ]
    for frame, label, extra, message in cases:
        with pytest.raises(ColumnError, match=message):
            tfbarrier.fit(spark.createDataFrame(frame), model, features={"token_ids": "ids", "padding_mask": "mask"},
                          label=label, num_workers=2, batch_size=GLOBAL_BATCH, **extra)
