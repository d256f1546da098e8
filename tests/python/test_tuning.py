"""tune(): one fit per trial, several at once, failures recorded, the best kept."""

import os

import numpy as np
import pytest
from conftest import digits_cnn, held_out_accuracy, left_behind, meet_in_pairs

import tfbarrier
from tfbarrier.errors import TrialsFailedError


def cnn(params):
    model = digits_cnn()
    model.optimizer.learning_rate.assign(params["learning_rate"])
    return model


@pytest.fixture(scope="module")
def search(spark, digits, tmp_path_factory):
    return tfbarrier.tune(spark.createDataFrame(digits[0]).cache(), cnn,
                          [{"learning_rate": lr} for lr in (0.0001, 0.01, 0.003)], features="pixels",
                          label="digit", validation_split=0.2, metric="val_accuracy", epochs=4, batch_size=64,
                          verbose=0, callbacks=meet_in_pairs(str(tmp_path_factory.mktemp("meetings")), pairs=1))


@pytest.mark.versions
def test_a_grid_runs_two_trials_at_a_time_on_two_slots_and_keeps_the_best(search, digits):
    trials = search.trials
    assert len(trials) == 3 and list(trials["status"]) == ["ok"] * 3
    assert {"trial", "learning_rate", "loss", "accuracy", "val_loss", "val_accuracy", "status", "error", "seconds",
            "started_at", "finished_at", "training_started_at", "training_finished_at"} <= set(trials.columns)
    # The first two trials trained at the same time: each ended its training only once the other had (a
    # trial waiting alone would have failed), so by their chiefs' own clocks each one's first step came
    # before the other's end (the driver's dispatch times would overlap even for stages run in turn).
    first, second = trials.iloc[0], trials.iloc[1]
    assert first["training_started_at"] < second["training_finished_at"]
    assert second["training_started_at"] < first["training_finished_at"]
    assert search.best_trial == int(trials["val_accuracy"].idxmax())
    assert search.best_params == {"learning_rate": trials["learning_rate"][search.best_trial]}
    assert search.best.history["val_accuracy"][-1] == trials["val_accuracy"].max()
    assert held_out_accuracy(search.best_model, digits[1]) >= 0.9
    assert left_behind() == []


def test_a_trial_whose_build_model_raises_is_recorded_and_the_others_run(spark, digits_df, capsys, tmp_path):
    def build(params):
        if params["learning_rate"] < 0:
            raise ValueError("negative learning rate")
        return cnn(params)

    search = tfbarrier.tune(digits_df, build, {"learning_rate": [-1.0, 0.01]}, features="pixels", label="digit",
                            metric="loss", epochs=1, batch_size=64, verbose=2, save_to=str(tmp_path))
    shown = capsys.readouterr().err
    assert "trial 0 {'learning_rate': -1.0}: ValueError: negative learning rate" in shown
    assert "trial 1 {'learning_rate': 0.01}: loss=" in shown and "2/2" in shown
    trials = search.trials
    assert list(trials["status"]) == ["failed", "ok"]
    assert trials["error"][0] == "ValueError: negative learning rate" and trials["error"][1] is None
    assert search.best_trial == 1 and np.isnan(trials["loss"][0])
    assert os.listdir(tmp_path) == ["trial-001"]  # each trial saves in a directory of its own
    assert search.best.saved == [{"epoch": 1, "path": str(tmp_path / "trial-001" / "epoch-001.keras")}]


def kill_the_trial_with_learning_rate(rate):
    """A callbacks factory killing worker 0 of the trial whose model has this learning rate."""
    def factory():
        import os
        import signal

        import tf_keras

        class Kill(tf_keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if abs(float(self.model.optimizer.learning_rate.numpy()) - rate) < 1e-9 and batch >= 2:
                    os.kill(os.getpid(), signal.SIGKILL)

        return [Kill()]

    return factory


def test_a_trial_whose_worker_is_killed_is_recorded_and_the_others_run(digits_df):
    search = tfbarrier.tune(digits_df, cnn, {"learning_rate": [0.01, 0.02, 0.005]}, features="pixels",
                            label="digit", metric="loss", epochs=1, batch_size=64, verbose=0,
                            callbacks=kill_the_trial_with_learning_rate(0.02))
    trials = search.trials
    assert list(trials["status"]) == ["ok", "failed", "ok"]
    assert trials["error"][1].startswith("WorkerError") and "killed by signal SIGKILL" in trials["error"][1]
    assert search.best_trial in (0, 2)
    assert left_behind() == []


def hang_the_trial_with_learning_rate(rate):
    """A callbacks factory hanging the training of the trial whose model has this learning rate."""
    def factory():
        import time

        import tf_keras

        class Hang(tf_keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if abs(float(self.model.optimizer.learning_rate.numpy()) - rate) < 1e-9:
                    time.sleep(3600)

        return [Hang()]

    return factory


def test_one_trial_at_a_time_of_model_functions_a_trial_past_its_timeout_fails_and_the_next_runs(digits_df):
    def build(params):  # a model function: each trial's workers build it with tf.keras
        rate = params["learning_rate"]

        def model():
            import tf_keras

            built = tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Flatten(),
                                         tf_keras.layers.Dense(10)])
            built.compile(optimizer=tf_keras.optimizers.SGD(rate),
                          loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            return built

        return model

    search = tfbarrier.tune(digits_df, build, {"learning_rate": [0.02, 0.01]}, features="pixels", label="digit",
                            metric="loss", epochs=1, batch_size=64, verbose=0, max_concurrent=1, timeout=30,
                            stall_timeout=None, callbacks=hang_the_trial_with_learning_rate(0.02))
    trials = search.trials
    assert list(trials["status"]) == ["failed", "ok"]
    assert trials["error"][0].startswith("JobTimeoutError") and "timeout of 30 s" in trials["error"][0]
    assert trials["finished_at"][0] <= trials["started_at"][1]  # max_concurrent=1: the second waited
    assert search.best_trial == 1 and search.best.model.optimizer.learning_rate.numpy() == pytest.approx(0.01)
    assert left_behind() == []


def test_when_every_trial_fails_tune_raises_with_each_error(digits_df):
    def build(params):
        raise ValueError(f"cannot build {params['units']}")

    with pytest.raises(TrialsFailedError, match="trial 0: ValueError: cannot build 1; trial 1: ValueError: "
                                                "cannot build 2") as failure:
        tfbarrier.tune(digits_df, build, {"units": [1, 2]}, features="pixels", label="digit", metric="loss",
                       verbose=0)
    assert list(failure.value.trials["status"]) == ["failed", "failed"]


def test_an_optuna_study_suggests_in_build_model_and_is_told_each_trials_metric(digits_df):
    import optuna

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=0))

    def build(trial):
        return cnn({"learning_rate": trial.suggest_float("learning_rate", 1e-3, 1e-1, log=True)})

    search = tfbarrier.tune(digits_df, build, study, n_trials=3, features="pixels", label="digit", metric="loss",
                            epochs=1, batch_size=64, verbose=0)
    told = study.trials
    assert [t.state.name for t in told] == ["COMPLETE"] * 3
    assert sorted(t.value for t in told) == sorted(search.trials["loss"])
    assert study.best_params == search.best_params and study.best_value == search.trials["loss"].min()
    assert list(search.trials["learning_rate"]) == [t.params["learning_rate"] for t in told]


@pytest.mark.parametrize("kwargs, message", [
    ({"params": []}, "params must be a non-empty list of dicts"),
    ({"params": [{"a": 1}], "metric": "val_loss"}, "metric='val_loss' is a validation metric"),
    ({"params": [{"a": 1}], "metric": "loss", "workers_per_trial": 3}, "num_workers=3 needs 3 task slots"),
    ({"params": [{"a": 1}], "metric": "loss", "epoch": 3}, "unknown argument.*'epoch' \\(did you mean 'epochs'"),
    ({"params": [{"a": 1}], "metric": "loss", "n_trials": 3}, "n_trials is for an optuna study"),
    ({"params": "optuna-max", "metric": "loss", "n_trials": 3}, "the study's direction is maximize but mode is 'min'"),
])
def test_bad_arguments_are_refused_before_any_trial(digits_df, kwargs, message):
    from tfbarrier.errors import TfBarrierError

    def build(params):
        raise AssertionError("no trial may start")

    if kwargs["params"] == "optuna-max":
        import optuna

        kwargs["params"] = optuna.create_study(direction="maximize")
    with pytest.raises(TfBarrierError, match=message):
        tfbarrier.tune(digits_df, build, features="pixels", label="digit", verbose=0, **kwargs)
