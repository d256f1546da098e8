"""Text in: a string column feeds a model that carries its own preprocessor (a KerasHub task's tokenizer and
packer), run batch by batch in the training processes as the rows stream, no token arrays made in Spark. A
KerasHub BertTextClassifier whose WordPiece tokenizer is built from a small vocabulary (no download), fitted from
a string column on 2 workers, ends with the losses, validation loss and weights of one process's
``classifier.fit`` on the same strings, then scores a string column on the executors as its local ``predict``
does; a GPT-2 causal LM fits from a string column alone (its preprocessor makes the labels) as one process
does, then generates text from a prompt column on the executors as its local ``generate`` does (text out); a
string column for a model that cannot read it, weights without a label, and generation that cannot run are
refused on the driver, before any Spark job."""

import keras
import numpy as np
import pandas as pd
import pytest
from conftest import model_loads, partitioned
from support import faults
from pyspark.sql import functions as F

import tfbarrier
from tfbarrier.errors import ColumnError, InvalidArgumentError, ModelError

ROWS_PER_WORKER = 16
GLOBAL_BATCH = 8
WORDS = ["good", "great", "fine", "bad", "awful", "poor", "the", "a", "movie", "film", "was", "is", "plot"]
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def classifier():
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(5)
    tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=VOCABULARY, lowercase=True)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=8)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=8, dropout=0.0)
    model = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor,
                                                dropout=0.0)
    model.compile(optimizer=keras.optimizers.SGD(0.2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["sparse_categorical_accuracy"])
    return model


def reviews(rows, seed):
    """Short reviews whose label is whether a good word outnumbers a bad one (Upper case: the tokenizer lowers)."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(rows):
        words = list(rng.choice(WORDS, rng.integers(2, 7)))
        labels.append(int(sum(w in WORDS[:3] for w in words) > sum(w in WORDS[3:6] for w in words)))
        texts.append(" ".join(words).capitalize())
    return pd.DataFrame({"text": texts, "label": labels})


def in_global_batches(frame):
    """The rows in the order one process sees the 2 workers' global batches (half a batch each, no shuffle)."""
    half = GLOBAL_BATCH // 2
    order = np.concatenate([np.r_[i:i + half, ROWS_PER_WORKER + i:ROWS_PER_WORKER + i + half]
                            for i in range(0, ROWS_PER_WORKER, half)])
    return frame.iloc[order]


@pytest.fixture(scope="module")
def one_process():
    """The classifier fitted by one process on the 2 workers' rows, in the order of their global batches."""
    reference, data, held_out = classifier(), reviews(2 * ROWS_PER_WORKER, seed=1), reviews(GLOBAL_BATCH, seed=2)
    ordered = in_global_batches(data)
    history = reference.fit(ordered["text"].to_numpy(), ordered["label"].to_numpy(), batch_size=GLOBAL_BATCH,
                            epochs=3, shuffle=False, verbose=0).history
    assert history["loss"][-1] < history["loss"][0]
    return reference, history, data, held_out


def assert_fits_as(result, reference, history):
    np.testing.assert_allclose(result.history["loss"], history["loss"], rtol=1e-4)
    for trained, expected in zip(result.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(trained, expected, rtol=1e-3, atol=1e-4)


def test_a_text_classifier_fits_from_a_string_column_as_one_process_and_scores_one(spark, one_process):
    reference, history, data, held_out = one_process
    df = partitioned(spark, data, lambda i: int(i >= ROWS_PER_WORKER), 2)
    result = tfbarrier.fit(df, classifier(), features="text", label="label", epochs=3, batch_size=GLOBAL_BATCH,
                           validation_data=spark.createDataFrame(held_out), num_workers=2, shuffle=False)

    assert_fits_as(result, reference, history)
    evaluated = reference.evaluate(held_out["text"].to_numpy(), held_out["label"].to_numpy(), batch_size=GLOBAL_BATCH,
                                   return_dict=True, verbose=0)
    np.testing.assert_allclose(result.history["val_loss"][-1], evaluated["loss"], rtol=1e-4)
    assert result.model.preprocessor is not None  # what came back reads strings as the user's model did
    assert type(result.model.optimizer).__name__ == "SGD"  # compiled as the user compiled it, not as a task's default

    scored = tfbarrier.predict(spark.createDataFrame(held_out).repartition(2), result.model, features="text",
                               output="raw").toPandas()
    local = result.model.predict(scored["text"].to_numpy(), verbose=0)
    np.testing.assert_allclose(np.stack(scored["prediction"]), local, rtol=1e-4, atol=1e-5)


def test_the_memory_check_traces_a_text_models_step_at_its_preprocessors_length():
    """A text fit's inputs are as long as its preprocessor's sequence_length, which no profile of a string column
    tells: the check traces a step at that length (before, nothing was traced: a transformer's layers hide their
    outputs' sizes, so they counted as none)."""
    from tfbarrier.data import text
    from tfbarrier.models import memory

    model = classifier()
    widths = text.sequence_widths(model)
    assert widths == {None: 8}
    size = memory.ModelSize.of(model, native=True).with_widths(model, memory.input_shapes(model, widths))
    assert size.kept is not None and size.kept[0] > 0, size.kept
    assert text.sequence_widths(keras.Sequential([keras.Input((3,))])) == {}  # no preprocessor: nothing told


def test_sample_weights_beside_a_string_column_weigh_each_row_as_in_one_process(spark):
    data = reviews(2 * ROWS_PER_WORKER, seed=3)
    data["weight"] = np.random.default_rng(4).uniform(0.1, 2.0, len(data)).astype("float32")
    reference, ordered = classifier(), in_global_batches(data)
    history = reference.fit(ordered["text"].to_numpy(), ordered["label"].to_numpy(),
                            sample_weight=ordered["weight"].to_numpy(), batch_size=GLOBAL_BATCH, epochs=2,
                            shuffle=False, verbose=0).history
    df = partitioned(spark, data, lambda i: int(i >= ROWS_PER_WORKER), 2)
    result = tfbarrier.fit(df, classifier(), features="text", label="label", sample_weight="weight", epochs=2,
                           batch_size=GLOBAL_BATCH, num_workers=2, shuffle=False, verbose=0)
    assert_fits_as(result, reference, history)


def test_a_fit_from_text_killed_mid_epoch_resumes_as_one_process_fits(spark, one_process, tmp_path):
    """The shards of text resume where the checkpoint left them: the resumed fit ends as one process's."""
    reference, history, data, _ = one_process
    df = partitioned(spark, data, lambda i: int(i >= ROWS_PER_WORKER), 2)
    result = tfbarrier.fit(df, classifier(), features="text", label="label", epochs=3, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False, checkpoint_dir=str(tmp_path), checkpoint_every=1,
                           max_retries=1, callbacks=faults.kill_after_step(worker=1, epoch=1, step=1))
    first, second = result.attempts
    assert "killed by signal SIGKILL" in first["error"]
    assert second["resumed_at"]["epoch"] == 1 and second["resumed_at"]["step"] == 2
    assert_fits_as(result, reference, history)


def test_tune_ranks_text_classifiers_fitted_from_a_string_column(spark, one_process):
    """Each trial (one worker) trains as one process does with its learning rate."""
    _, _, data, _ = one_process
    rates = [0.2, 0.05]

    def build(params):
        model = classifier()
        model.optimizer.learning_rate.assign(params["learning_rate"])
        return model

    search = tfbarrier.tune(partitioned(spark, data, lambda i: 0, 1), build, [{"learning_rate": r} for r in rates],
                            features="text", label="label", metric="loss", epochs=2, batch_size=GLOBAL_BATCH,
                            shuffle=False, verbose=0)
    assert list(search.trials["status"]) == ["ok", "ok"], list(search.trials["error"])
    for rate, loss in zip(rates, search.trials["loss"]):
        local = build({"learning_rate": rate}).fit(data["text"].to_numpy(), data["label"].to_numpy(),
                                                    batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        np.testing.assert_allclose(loss, local.history["loss"][-1], rtol=1e-4)
    assert search.best_params == {"learning_rate": rates[int(np.argmin(search.trials["loss"]))]}


def test_a_text_model_scored_again_later_is_not_loaded_again(spark, tmp_path):
    """A .keras archive stamps the second it was saved: a model scored again a second later is the same model, and
    each Python worker keeps the copy it loaded (and, for a causal LM, its traced generation)."""
    import time

    model = classifier()
    df = spark.createDataFrame(reviews(8, seed=6)).repartition(2)
    with model_loads(spark, tmp_path / "loads.log") as loaders:
        first = tfbarrier.predict(df, model, features="text", output="raw").toPandas()
        time.sleep(1.1)  # the archive saved for the second call is stamped with another second
        second = tfbarrier.predict(df, model, features="text", output="raw").toPandas()
        pids = loaders()
    assert 1 <= len(pids) <= 2 and len(set(pids)) == len(pids)  # local[2]: one load a Python worker, both calls
    assert sorted(map(tuple, np.stack(first["prediction"]))) == sorted(map(tuple, np.stack(second["prediction"])))


def test_text_that_cannot_train_is_refused_before_any_spark_job(spark):
    model = classifier()
    model.preprocessor = None
    df = spark.createDataFrame(reviews(8, seed=3))
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    for call in (lambda: tfbarrier.fit(df, model, features="text", label="label", num_workers=2),
                 lambda: tfbarrier.predict(df, model, features="text")):
        with pytest.raises(ModelError, match=r"feature column 'text' holds strings, but the model cannot read them: "
                                             r"it has no preprocessor.*or tokenize the column"):
            call()
    lm = causal_lm()
    with pytest.raises(ColumnError, match=r"sample_weight column 'w' without a label: a preprocessor that makes the "
                                          r"labels from the text makes their weights too"):
        tfbarrier.fit(df.withColumn("w", F.lit(1.0)), lm, features="text", sample_weight="w", num_workers=2)
    with pytest.raises(InvalidArgumentError, match="class_weight without a label"):
        tfbarrier.fit(df, lm, features="text", class_weight={0: 2.0}, num_workers=2)
    lm.preprocessor = unsavable(lm.preprocessor)
    for call in (lambda: tfbarrier.fit(df, lm, features="text", num_workers=2),
                 lambda: tfbarrier.predict(df, lm, features="text", output="raw"),
                 lambda: tfbarrier.predict(df, lm, features="text", output="text")):
        with pytest.raises(ModelError, match=r"the model cannot be saved as a .keras archive \(TypeError: .*so it cannot "
                                             r"travel to the executors: give its custom layers .*get_config\(\)"):
            call()
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs


def unsavable(preprocessor):
    """``preprocessor`` as one whose config Keras cannot write (it holds a lock)."""
    import threading

    class LockedPreprocessor(type(preprocessor)):
        def get_config(self):
            return {**super().get_config(), "lock": threading.Lock()}

    return LockedPreprocessor(preprocessor.tokenizer, sequence_length=preprocessor.sequence_length)


CHARACTERS = "abcdefgh"


def causal_lm():
    """A GPT-2 causal LM built from a config, its byte-pair tokenizer about a character a token (no download)."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(6)
    # The padding id is 0 and must not be the end token: KerasHub's samplers stop when every row holds one
    vocabulary = {"Ġ": 0, **{c: i + 1 for i, c in enumerate(CHARACTERS)}}
    vocabulary["ab"] = len(vocabulary)  # one merge (an empty merge table cannot be made)
    vocabulary["<|endoftext|>"] = len(vocabulary)
    tokenizer = keras_hub.tokenizers.GPT2Tokenizer(vocabulary=vocabulary, merges=["a b"])
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=12)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=len(vocabulary), num_layers=1, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=16, dropout=0.0)
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor)
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["sparse_categorical_accuracy"])
    return model


def phrases(rows, seed):
    """Runs of consecutive letters (a pattern to learn), in words of different lengths."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(rows):
        start, length = rng.integers(0, len(CHARACTERS)), rng.integers(2, 6)
        word = "".join(CHARACTERS[(start + i) % len(CHARACTERS)] for i in range(length))
        texts.append(" ".join([word] * int(rng.integers(1, 3))))
    return pd.DataFrame({"text": texts})


def test_a_causal_lm_fits_from_a_string_column_alone_as_one_process(spark, tmp_path):
    """No label column: the causal LM's preprocessor makes the next tokens and the padding mask from the text."""
    model, reference = causal_lm(), causal_lm()
    data, held_out = phrases(2 * ROWS_PER_WORKER, seed=4), phrases(GLOBAL_BATCH, seed=5)
    df = partitioned(spark, data, lambda i: int(i >= ROWS_PER_WORKER), 2)
    result = tfbarrier.fit(df, model, features="text", epochs=3, batch_size=GLOBAL_BATCH, num_workers=2,
                           validation_data=spark.createDataFrame(held_out), shuffle=False, save_to=str(tmp_path))

    history = reference.fit(in_global_batches(data)["text"].to_numpy(), batch_size=GLOBAL_BATCH, epochs=3,
                            shuffle=False, verbose=0).history
    np.testing.assert_allclose(result.history["loss"], history["loss"], rtol=1e-4)
    assert history["loss"][-1] < history["loss"][0]
    for trained, expected in zip(result.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(trained, expected, rtol=1e-3, atol=1e-4)
    evaluated = reference.evaluate(held_out["text"].to_numpy(), batch_size=GLOBAL_BATCH, return_dict=True, verbose=0)
    np.testing.assert_allclose(result.history["val_loss"][-1], evaluated["loss"], rtol=1e-4)
    np.testing.assert_allclose(result.history["val_sparse_categorical_accuracy"][-1],
                               evaluated["sparse_categorical_accuracy"], rtol=1e-5)

    # save_to's archives keep the preprocessor the model trained without: the last one reads strings as the result.
    last = keras.saving.load_model(result.saved[-1]["path"])
    assert last.preprocessor is not None, result.saved
    np.testing.assert_allclose(last.predict(held_out["text"].to_numpy(), verbose=0),
                               result.model.predict(held_out["text"].to_numpy(), verbose=0), rtol=1e-5, atol=1e-6)

    # Text out: greedy generation on the executors (a partition of 4 prompts, one generate() call each, so one
    # trace a Python worker) is the model's own over all 8 at once, row for row.
    prompts = pd.DataFrame({"prompt": ["ab", "cd e", "h", "fgh fg", "b", "abc ab", "e", "gh"]})
    generated = tfbarrier.predict(partitioned(spark, prompts, lambda i: i % 2, 2), result.model, features="prompt",
                                  output="text", output_col="text", max_length=10, batch_size=4).toPandas()
    result.model.compile(sampler="greedy")
    expected = result.model.generate(generated["prompt"].tolist(), max_length=10)
    assert generated["text"].tolist() == expected
    assert all(out.startswith(prompt) and len(out) > len(prompt) for prompt, out in zip(generated["prompt"], expected))
    # A seeded sampler starts afresh in every task: each partition's text is the local model's from those prompts
    # with a new copy of the sampler, whatever the worker generated before.
    keras_hub = pytest.importorskip("keras_hub")
    sampled = tfbarrier.predict(partitioned(spark, prompts, lambda i: i % 2, 2), result.model, features="prompt",
                                output="text", output_col="text", max_length=10, batch_size=4,
                                sampler=keras_hub.samplers.TopKSampler(k=4, seed=3)).toPandas().set_index("prompt")
    for part in (0, 1):
        rows = prompts["prompt"].iloc[part::2].tolist()
        result.model.compile(sampler=keras_hub.samplers.TopKSampler(k=4, seed=3))
        assert sampled.loc[rows, "text"].tolist() == result.model.generate(rows, max_length=10)
    # A prompt that fills max_length would be cut and get nothing: its task fails naming it.
    with pytest.raises(Exception, match=r"row 1 of the partition: its prompt fills all 4 tokens of max_length"):
        tfbarrier.predict(spark.createDataFrame(pd.DataFrame({"prompt": ["ab", "abcdefgh"]}), schema="prompt string")
                          .coalesce(1), result.model, features="prompt", output="text", max_length=4).collect()


def test_generation_that_cannot_run_is_refused_before_any_spark_job(spark):
    lm, prompts = causal_lm(), spark.createDataFrame(pd.DataFrame({"prompt": ["ab"], "n": [1.0]}))
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup()
    refusals = [
        (ModelError, r"output='text' generates with a KerasHub causal LM .*got a BertTextClassifier",
         dict(model=classifier())),
        (ModelError, r"needs the causal LM's preprocessor.*this GPT2CausalLM has none", dict(model=causal_lm())),
        (InvalidArgumentError, r"max_length=17 is more than the model's 16 positions", dict(max_length=17)),
        (InvalidArgumentError, r"sampler must be a KerasHub sampler or its name", dict(sampler="loudest")),
        (ColumnError, r"output='text' needs one string column of prompts", dict(features="n")),
        (ColumnError, r"output_col 'n' must be a new column name", dict(output_col="n")),
    ]
    refusals[1][2]["model"].preprocessor = None
    for error, message, given in refusals:
        call = {"model": lm, "features": "prompt", "output": "text", **given}
        with pytest.raises(error, match=message):
            tfbarrier.predict(prompts, call.pop("model"), **call)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs
