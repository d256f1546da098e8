"""Validation in fit (evaluation.py): validation_data and validation_split evaluate every validation
row exactly once per epoch across the workers, as a single process's model.evaluate does, and
callbacks that stop on val_* stop every worker at the same epoch."""

import re

import numpy as np
import pandas as pd
import pytest
from conftest import digits_cnn, left_behind, overshooting_line, partitioned
from support import faults

import tfbarrier


def evaluate_locally(model, frame):
    x = np.stack(frame["pixels"].to_numpy()).reshape(-1, 8, 8, 1).astype("float32")
    return model.evaluate(x, frame["digit"].to_numpy(), batch_size=len(frame), verbose=0, return_dict=True)


@pytest.mark.parametrize("split", [(1, 299), (0, 3)])
def test_validation_data_is_evaluated_once_per_row_like_model_evaluate(spark, digits, split):
    """validation_data in two deliberately uneven partitions (one of 1 row, one empty), which each
    worker gets as they are (an even split takes the same path, with no padding row to leave out)."""
    train, held_out = digits[0], digits[1].iloc[:sum(split)]
    validation_data = partitioned(spark, held_out, lambda i: int(i >= split[0]), 2)
    result = tfbarrier.fit(spark.createDataFrame(train), digits_cnn(), features="pixels", label="digit", epochs=2,
                           batch_size=64, num_workers=2, seed=1, verbose=0, validation_data=validation_data)
    assert tuple(w["validation_rows"] for w in result.workers) == split
    assert sum(w["rows"] for w in result.workers) == len(train)
    assert set(result.history) == {"loss", "accuracy", "val_loss", "val_accuracy"} and result.epochs == 2
    local = evaluate_locally(result.model, held_out)
    assert result.history["val_loss"][-1] == pytest.approx(local["loss"], abs=1e-4)
    rows = sum(split)
    assert round(result.history["val_accuracy"][-1] * rows) == round(local["accuracy"] * rows)


def test_partitions_other_than_num_workers_are_dealt_round_robin(spark, digits):
    """A training frame of 3 partitions and validation_data in 1: each partition's rows are dealt to
    the workers in turn, so both get an even share of each."""
    train = spark.createDataFrame(digits[0]).repartition(3)
    result = tfbarrier.fit(train, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64,
                           verbose=0, validation_data=spark.createDataFrame(digits[1]).coalesce(1))
    rows, held = ([w[key] for w in result.workers] for key in ("rows", "validation_rows"))
    assert sum(rows) == len(digits[0]) and abs(rows[0] - rows[1]) <= 3
    assert held == [len(digits[1]) // 2] * 2


def written_events(result):
    """{(attempt, worker): validation checksum} from the tasks' 'partition written' events."""
    found, attempt = {}, 0
    for message in result.progress:
        if message["kind"] == "event" and message["event"].startswith("task started"):
            attempt = int(re.search(r"attempt (\d+)", message["event"]).group(1))
        if message["kind"] == "event" and "validation checksum" in message["event"]:
            found[(attempt, message["worker"])] = re.search(r"validation checksum (\w+)", message["event"]).group(1)
    return found


def test_validation_split_holds_out_the_same_rows_on_a_retry(digits_df):
    result = tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", epochs=2, batch_size=64,
                           num_workers=2, seed=3, validation_split=0.2, max_retries=1, verbose=0,
                           callbacks=faults.kill_first_attempt(worker=1, epoch=1))
    assert [a["attempt"] for a in result.attempts] == [1, 2] and result.attempts[1]["error"] is None
    held = written_events(result)
    assert held[(1, 0)] == held[(2, 0)] and held[(1, 1)] == held[(2, 1)]
    rows = sum(w["rows"] + w["validation_rows"] for w in result.workers)
    assert 0.15 < sum(w["validation_rows"] for w in result.workers) / rows < 0.25
    assert len(result.history["val_loss"]) == 2 and None not in result.history["val_loss"]


def keras_callbacks(name, **kwargs):
    def factory():
        import tf_keras

        return [getattr(tf_keras.callbacks, name)(monitor="val_loss", patience=1, **kwargs)]
    return factory


def fit_opposite(data, callback, epochs):
    return tfbarrier.fit(data[0], overshooting_line, features="x", label="y", epochs=epochs, batch_size=8,
                         steps_per_epoch=1, num_workers=2, shuffle=False, validation_data=data[1],
                         callbacks=callback, timeout=300, verbose=0)


def test_early_stopping_stops_every_worker_on_the_val_loss_of_all_of_them(opposite_workers):
    result = fit_opposite(opposite_workers, keras_callbacks("EarlyStopping"), epochs=6)
    assert result.history["val_loss"] == pytest.approx([6.74, 7.2104], rel=1e-5)
    assert result.stopped_epoch == 1 and result.epochs == 2  # epoch 0 is the best, epoch 1 no better
    assert [w["steps"] for w in result.workers] == [2, 2]
    assert left_behind() == []
    axis, = result.plot().axes  # one panel, loss and its validation twin
    assert [line.get_label() for line in axis.get_lines()] == ["loss", "val_loss"]
    assert list(axis.get_lines()[1].get_ydata()) == pytest.approx([6.74, 7.2104], rel=1e-5)


def test_reduce_lr_on_plateau_lowers_every_workers_rate_alike(opposite_workers):
    """Halved after epoch 1 on every worker: epoch 2's step is w -= 0.6 (2w + 1), from 0.48 to -0.696,
    and the workers' weights stay equal (a worker that halved alone would diverge from the others)."""
    result = fit_opposite(opposite_workers, keras_callbacks("ReduceLROnPlateau", factor=0.5), epochs=3)
    assert result.model.get_weights()[0].item() == pytest.approx(-0.696, rel=1e-5)
    assert len({w["checksum"] for w in result.workers}) == 1


def test_validation_freq_validates_every_nth_epoch(spark, digits):
    result = tfbarrier.fit(spark.createDataFrame(digits[0]), digits_cnn(), features="pixels", label="digit",
                           epochs=3, batch_size=64, num_workers=2, verbose=0, validation_freq=2,
                           validation_data=spark.createDataFrame(digits[1]))
    assert [v is None for v in result.history["val_loss"]] == [True, False, True]
    assert len(result.history_frame()) == 3
    # the last epoch did not validate: repr shows the last validation there was (it raised TypeError)
    assert f"val_loss={result.history['val_loss'][1]:.4g}" in repr(result)
    assert f"loss={result.history['loss'][2]:.4g}" in repr(result)


@pytest.mark.parametrize("kwargs, message", [
    ({"validation_split": 0.2, "validation_data": "df"}, "validation_data or validation_split, not both"),
    ({"validation_split": 1.5}, "validation_split must be a fraction between 0 and 1"),
    ({"validation_data": pd.DataFrame({"x": [1]})}, "validation_data must be a Spark DataFrame"),
    ({"validation_data": "no label"}, "column 'digit' is not in the DataFrame"),
    ({"validation_split": 0.2, "validation_freq": 2.5}, "validation_freq must be a positive integer"),
    ({"validation_freq": 0}, "validation_freq must be a positive integer"),
])
def test_bad_validation_arguments_are_refused_on_the_driver(digits_df, kwargs, message):
    from tfbarrier.errors import TfBarrierError

    frames = {"df": digits_df, "no label": digits_df.select("pixels")}
    kwargs = {k: frames[v] if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(TfBarrierError, match=message):
        tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", **kwargs)


def class_accuracy(model, frame, digit):
    rows = frame[frame["digit"] == digit]
    x = np.stack(rows["pixels"].to_numpy()).reshape(-1, 8, 8, 1).astype("float32")
    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == digit))


@pytest.fixture(scope="module")
def weighted_fits(spark, digits):
    """The same model and seed trained three times: as is, with sample weights of 0 for the 3s, and
    with a class weight of 0 for them."""
    train = digits[0].assign(weight=(digits[0]["digit"] != 3).astype(float))
    df = spark.createDataFrame(train).cache()
    model = digits_cnn()

    def fit(**kwargs):
        return tfbarrier.fit(df, model, features="pixels", label="digit", epochs=4, batch_size=64, num_workers=2,
                             seed=1, verbose=0, **kwargs)

    return fit(), fit(sample_weight="weight"), fit(class_weight={3: 0.0})


def test_sample_weights_of_zero_for_a_class_make_it_unlearned(weighted_fits, digits):
    plain, weighted, _ = weighted_fits
    assert class_accuracy(plain.model, digits[1], 3) > 0.8
    assert class_accuracy(weighted.model, digits[1], 3) < 0.2
    assert class_accuracy(weighted.model, digits[1], 1) > 0.8  # the other classes are still learned


def test_a_class_weight_of_zero_does_the_same(weighted_fits, digits):
    _, by_rows, by_class = weighted_fits
    assert class_accuracy(by_class.model, digits[1], 3) < 0.2
    assert by_class.workers[0]["checksum"] == by_rows.workers[0]["checksum"]  # the same weights, row by row


def test_validation_loss_uses_the_rows_sample_weights_like_model_evaluate(spark, digits):
    train = digits[0].assign(weight=1.0)
    held_out = digits[1].assign(weight=np.where(digits[1]["digit"] % 2 == 0, 2.0, 0.5))
    result = tfbarrier.fit(spark.createDataFrame(train), digits_cnn(), features="pixels", label="digit", epochs=1,
                           batch_size=64, num_workers=2, seed=1, verbose=0, sample_weight="weight",
                           validation_data=spark.createDataFrame(held_out))
    x = np.stack(held_out["pixels"].to_numpy()).reshape(-1, 8, 8, 1).astype("float32")
    local = result.model.evaluate(x, held_out["digit"].to_numpy(), sample_weight=held_out["weight"].to_numpy(),
                                  batch_size=len(held_out), verbose=0, return_dict=True)
    assert result.history["val_loss"][-1] == pytest.approx(local["loss"], abs=1e-4)


@pytest.mark.parametrize("kwargs, message", [
    ({"sample_weight": "nope"}, "sample_weight column 'nope' must be a numeric column"),
    ({"class_weight": {"a": 1}}, "class_weight must map class ids"),
    ({"class_weight": {1: -2}}, "class_weight must map class ids"),
])
def test_bad_weights_are_refused_on_the_driver(digits_df, kwargs, message):
    from tfbarrier.errors import TfBarrierError

    with pytest.raises(TfBarrierError, match=message):
        tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", **kwargs)
