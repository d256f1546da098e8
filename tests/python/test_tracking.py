"""fit(mlflow=...) and tune(mlflow=...): what reaches real MLflow stores, read back with MlflowClient (a
local SQLite store, and an `mlflow server` this module starts on 127.0.0.1), and what never reaches the
training processes."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import mlflow
import numpy as np
import pytest
from conftest import digits_cnn

import tfbarrier
from tfbarrier.errors import InvalidArgumentError

FIT = {"features": "pixels", "label": "digit", "batch_size": 64, "num_workers": 2, "verbose": 0}
PAUSE = 3.0  # seconds the chief waits after its first epoch in the main fit: time to see that epoch live


@contextlib.contextmanager
def tracking_to(directory):
    """For the block, MLflow's tracking URI is a SQLite store in ``directory`` (set with
    mlflow.set_tracking_uri), and so is the working directory, where such a store keeps its artifacts
    (./mlruns); then both are as they were."""
    previous, cwd = os.environ.get("MLFLOW_TRACKING_URI"), os.getcwd()
    uri = f"sqlite:///{directory / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    os.chdir(directory)
    try:
        yield mlflow.MlflowClient(uri)
    finally:
        os.chdir(cwd)
        mlflow.set_tracking_uri(previous)


def held_out_images(digits):
    return np.stack(digits[1]["pixels"].to_numpy()).reshape(-1, 8, 8, 1).astype("float32")


CONTROL_IMPORT = "colorsys"  # a module no training process imports: the factory does, to show that imports are seen


def record_imports_and_pause(directory, pause=0.0):
    """A callbacks factory: each training process appends to ``<pid>.jsonl`` in ``directory`` which of
    mlflow and tf_keras are in its sys.modules (tf_keras, which it does import, shows that the record sees
    imports) when the factory runs (what was imported before), at the start of training, after every batch
    and at its end; and from the factory on, every import of an mlflow module as it happens, whenever that
    is until the process exits (a finder first in sys.meta_path notes it and lets the import go on; the
    factory's own import of CONTROL_IMPORT shows that it sees them). The chief waits ``pause`` seconds after
    its first epoch, once that epoch's metrics are on their way."""
    def factory():
        import json
        import os
        import sys
        import time

        import tf_keras

        chief = json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0
        path = os.path.join(directory, f"{os.getpid()}.jsonl")

        def write(record):
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")

        def note(when):
            write({"when": when, "imported": sorted({name.split(".")[0] for name in sys.modules} & {"mlflow", "tf_keras"})})

        class Imports:  # an importlib meta path finder that finds nothing: it only looks
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("mlflow", CONTROL_IMPORT):
                    write({"when": "import", "module": name})
                return None

        note("factory")
        sys.meta_path.insert(0, Imports())
        sys.modules.pop(CONTROL_IMPORT, None)
        __import__(CONTROL_IMPORT)

        class Record(tf_keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                note("train_begin")

            def on_train_batch_end(self, batch, logs=None):
                note("batch")

            def on_epoch_end(self, epoch, logs=None):
                if chief and epoch == 0:
                    time.sleep(pause)

            def on_train_end(self, logs=None):
                note("train_end")

        return [Record()]

    return factory


class FirstLoss(threading.Thread):
    """Polls an experiment until one of its runs has a ``loss``; ``seen_at`` is when it first had."""

    def __init__(self, client, experiment_id):
        super().__init__(daemon=True)
        self.client, self.experiment_id = client, experiment_id
        self.seen_at, self.stop = None, threading.Event()

    def run(self):
        while not self.stop.wait(0.1):
            if any("loss" in r.data.metrics for r in self.client.search_runs([self.experiment_id])):
                self.seen_at = time.time()
                return


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The directory of a local SQLite store, MLflow's default kind."""
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture(scope="module")
def fitted(spark, digits_df, local, tmp_path_factory):
    """A 2-worker fit logged to the experiment "digits" of the local store, whose first logged loss was
    watched for while it trained; (result, client, the training processes' import records, when the
    loss was first seen)."""
    imports = tmp_path_factory.mktemp("imports")
    with tracking_to(local) as client:
        watch = FirstLoss(client, client.create_experiment("digits"))
        watch.start()
        result = tfbarrier.fit(digits_df, digits_cnn(), epochs=2, validation_split=0.2, mlflow="digits",
                               callbacks=record_imports_and_pause(str(imports), PAUSE), **FIT)
        watch.stop.set()
        watch.join()
    return result, client, imports, watch.seen_at


def test_a_fit_logs_one_run_in_the_named_experiment_with_what_shaped_its_training(fitted):
    result, client, _, _ = fitted
    runs = client.search_runs([client.get_experiment_by_name("digits").experiment_id])
    assert [run.info.run_id for run in runs] == [result.mlflow_run_id]  # one run for the fit, none per worker
    run = runs[0]
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert {k: params[k] for k in ("epochs", "batch_size", "num_workers", "validation_split", "features", "label",
                                   "spark_master", "optimizer", "model_kind", "exchange")} == {
        "epochs": "2", "batch_size": "64", "num_workers": "2", "validation_split": "0.2", "features": '["pixels"]',
        "label": "digit", "spark_master": "local[2]", "optimizer": "Adam", "model_kind": "keras3",
        "exchange": "tfbarrier"}
    assert params["model_parameters"] == str(result.model.count_params())
    assert float(params["optimizer_learning_rate"]) == pytest.approx(0.01)
    assert params["tfbarrier_version"] == tfbarrier.__version__ and params["tensorflow_version"].startswith("2.")


def test_each_epoch_is_one_point_per_metric_at_step_epoch_logged_while_the_fit_trains(fitted):
    result, client, _, seen_at = fitted
    assert set(result.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    for name, values in result.history.items():
        points = client.get_metric_history(result.mlflow_run_id, name)
        assert [p.step for p in points] == [1, 2], name
        assert [p.value for p in points] == pytest.approx(values), name
    rates = client.get_metric_history(result.mlflow_run_id, "samples_per_second")
    assert rates and {p.step for p in rates} <= {1, 2} and all(p.value > 0 for p in rates)
    # The first epoch's loss was in the store while the chief still trained (it paused after that epoch).
    assert seen_at is not None and seen_at < result.workers[0]["finished_at"]


def test_the_logged_model_loads_in_keras_3_and_predicts_as_the_result_model(fitted, digits, local):
    result, _, _, _ = fitted
    with tracking_to(local):
        loaded = mlflow.keras.load_model(f"runs:/{result.mlflow_run_id}/model")
    assert type(loaded).__module__.startswith("keras.")
    x = held_out_images(digits)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), result.model.predict(x, verbose=0), rtol=1e-5, atol=1e-5)


def test_the_run_keeps_the_curves_the_timings_the_workers_and_the_attempts(fitted, tmp_path):
    result, client, _, _ = fitted
    run_id = result.mlflow_run_id
    curves = client.download_artifacts(run_id, "curves.png", str(tmp_path))
    with open(curves, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(client.download_artifacts(run_id, "tfbarrier/fit.json", str(tmp_path))) as f:
        details = json.load(f)
    assert [w["index"] for w in details["workers"]] == [0, 1]
    assert [w["rows"] for w in details["workers"]] == [w["rows"] for w in result.workers]
    tags = client.get_run(run_id).data.tags
    for phase in ("prepare", "time_to_first_step", "training", "total"):
        assert float(tags[f"tfbarrier.timing.{phase}"]) == pytest.approx(result.timings[phase], abs=1e-3)
    assert tags["tfbarrier.attempts"] == "1" and not any(".error" in name for name in tags)


def test_the_training_processes_never_import_mlflow(fitted):
    _, _, imports, _ = fitted
    records = [[json.loads(line) for line in path.read_text().splitlines()] for path in imports.iterdir()]
    assert len(records) == 2  # both processes
    for record in records:
        looks = [entry for entry in record if "imported" in entry]
        assert [entry["when"] for entry in looks] == ["factory", "train_begin", *["batch"] * len(looks[2:-1]),
                                                      "train_end"] and len(looks) > 4, record
        assert all(entry["imported"] == ["tf_keras"] for entry in looks), record  # tf_keras seen, never mlflow
        # no import of mlflow at any time, before exit included; the control import was seen
        assert [entry for entry in record if "module" in entry] == [{"when": "import", "module": CONTROL_IMPORT}]


def fail_after_the_first_epoch():
    import tf_keras

    class Fail(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError(f"boom at epoch {epoch + 1}")

    return [Fail()]


def test_a_failed_fit_ends_its_run_failed_with_the_error(spark, digits_df, local):
    with tracking_to(local) as client:
        with pytest.raises(tfbarrier.errors.TfBarrierError) as raised:
            tfbarrier.fit(digits_df, digits_cnn(), epochs=2, mlflow="failing", callbacks=fail_after_the_first_epoch,
                          **FIT)
    (run,) = client.search_runs([client.get_experiment_by_name("failing").experiment_id])
    assert run.info.status == "FAILED"
    error = run.data.tags["tfbarrier.error"]
    assert error.startswith(type(raised.value).__name__ + ":") and "boom at epoch 1" in error
    assert run.data.tags["tfbarrier.attempts"] == "1"
    assert "boom at epoch 1" in run.data.tags["tfbarrier.attempt.1.error"]
    assert [p.step for p in client.get_metric_history(run.info.run_id, "loss")] == [1]  # the epoch that ended


def tf_keras_model():
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((8, 8, 1)), tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])
    model.compile(optimizer=tf_keras.optimizers.SGD(0.05),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_mlflow_true_in_an_active_run_logs_there_and_leaves_it_running(spark, digits_df, digits, local, tmp_path):
    import tf_keras

    with tracking_to(local) as client, mlflow.start_run() as active:
        result = tfbarrier.fit(digits_df, tf_keras_model, epochs=1, mlflow=True, **FIT)
        run = client.get_run(active.info.run_id)
    assert result.mlflow_run_id == active.info.run_id and run.info.status == "RUNNING"  # its owner ends it
    # A model function's size and optimizer are known once it trained.
    assert run.data.params["model_kind"] == "function" and run.data.params["optimizer"] == "SGD"
    assert run.data.params["model_parameters"] == str(result.model.count_params())
    # Keras 3 is this driver's tf.keras: MLflow has no flavor for tf_keras here, the run keeps its archive.
    archive = client.download_artifacts(run.info.run_id, "model/model.keras", str(tmp_path))
    loaded = tf_keras.models.load_model(archive)
    x = held_out_images(digits)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), result.model.predict(x, verbose=0), rtol=1e-5, atol=1e-5)


def test_without_the_driver_link_a_run_given_by_id_gets_the_history_once_at_the_end(spark, digits_df, local):
    with tracking_to(local) as client:
        given = client.create_run(client.create_experiment("no-link")).info.run_id
        spark.conf.set("spark.tfbarrier.driverLink", "false")
        try:
            result = tfbarrier.fit(digits_df, digits_cnn(), epochs=2, validation_split=0.2, mlflow=given, **FIT)
        finally:
            spark.conf.unset("spark.tfbarrier.driverLink")
    assert result.mlflow_run_id == given and client.get_run(given).info.status == "RUNNING"
    assert result.workers[0]["transfer"]["via"] == "spark"  # no link indeed
    for name, values in result.history.items():
        points = client.get_metric_history(given, name)
        assert [p.step for p in points] == [1, 2] and [p.value for p in points] == pytest.approx(values), name
    assert client.get_metric_history(given, "samples_per_second") == []  # measured live only


def test_a_tf_keras_model_logs_as_mlflow_tensorflow_where_tf_keras_is_tf_keras(tmp_path):
    # A driver with TF_USE_LEGACY_KERAS=1 (no Spark: the model logging alone, in a process of its own).
    script = """
import json, sys
import numpy as np, mlflow, tf_keras
from tfbarrier import tracking
model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(3)])
model.compile(optimizer="adam", loss="mse")
mlflow.set_tracking_uri(sys.argv[1])
client = mlflow.MlflowClient()
run_id = client.create_run("0").info.run_id
tracking.log_model(client, run_id, model)
loaded = mlflow.tensorflow.load_model(f"runs:/{run_id}/model")
x = np.random.default_rng(0).random((5, 4), dtype="float32")
print("RESULT " + json.dumps({"class": type(loaded).__module__,
      "difference": float(np.abs(loaded.predict(x, verbose=0) - model.predict(x, verbose=0)).max())}))
"""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    out = subprocess.run([sys.executable, "-c", script, f"sqlite:///{tmp_path / 'store.db'}"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stderr[-3000:]
    found = json.loads(lines[0][7:])
    assert found["class"].startswith("tf_keras.") and found["difference"] < 1e-6


@pytest.mark.parametrize("value", [3, "", "0" * 32])
def test_a_bad_mlflow_argument_is_refused_before_any_spark_job(spark, digits_df, local, value):
    jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))
    with tracking_to(local), pytest.raises(InvalidArgumentError, match="mlflow"):
        tfbarrier.fit(digits_df, digits_cnn(), epochs=1, mlflow=value, **FIT)
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup(None)) == jobs


def test_an_active_run_object_is_continued_and_true_without_one_starts_in_the_current_experiment(local,
                                                                                                 monkeypatch):
    from tfbarrier import tracking

    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "current")  # as mlflow.start_run() picks its experiment
    with tracking_to(local) as client:
        with mlflow.start_run() as active:
            continued = tracking.resolve(active)
        started = tracking.resolve(True)
    assert (continued.run_id, continued.experiment_id) == (active.info.run_id, None)
    assert (started.run_id, started.experiment_id) == (None, client.get_experiment_by_name("current").experiment_id)


def test_without_mlflow_installed_mlflow_true_names_the_extra_to_install(digits_df, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` meets where MLflow is not installed
    for call in (lambda: tfbarrier.fit(digits_df, digits_cnn(), mlflow=True, **FIT),
                 lambda: tfbarrier.tune(digits_df, lambda p: digits_cnn(), [{}], features="pixels", label="digit",
                                        metric="loss", mlflow=True)):
        with pytest.raises(InvalidArgumentError, match=r"pip install tfbarrier\[mlflow\]"):
            call()


def test_an_optuna_search_logs_a_parent_run_and_a_nested_run_per_trial(spark, digits_df, local):
    import optuna

    def build(trial):
        rate = trial.suggest_float("learning_rate", 1e-3, 3e-2, log=True)
        if trial.number == 0:
            raise ValueError("no model for the first trial")
        model = digits_cnn()
        model.optimizer.learning_rate.assign(rate)
        return model

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    with tracking_to(local) as client:
        search = tfbarrier.tune(digits_df, build, study, n_trials=3, features="pixels", label="digit",
                                metric="accuracy", epochs=1, batch_size=64, verbose=0, mlflow="search")
    runs = client.search_runs([client.get_experiment_by_name("search").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = {int(r.data.tags["tfbarrier.trial"]): r for r in runs if r is not parent}
    assert parent.info.run_id == search.mlflow_run_id and parent.info.status == "FINISHED"
    assert parent.data.params["search"] == "optuna TPESampler" and parent.data.params["trials"] == "3"
    assert sorted(trials) == [0, 1, 2]
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in trials.values())
    assert trials[0].info.status == "FAILED"
    assert trials[0].data.tags["tfbarrier.error"] == "ValueError: no model for the first trial"
    for index in (1, 2):
        run = trials[index]
        assert run.info.status == "FINISHED" and run.info.run_name == f"trial-{index:03d}"
        assert float(run.data.params["learning_rate"]) == pytest.approx(search.trials["learning_rate"][index])
        points = client.get_metric_history(run.info.run_id, "accuracy")
        assert [p.step for p in points] == [1] and points[0].value == pytest.approx(search.trials["accuracy"][index])
    assert [i for i, r in trials.items() if r.data.tags.get("tfbarrier.best") == "true"] == [search.best_trial]
    per_trial = client.get_metric_history(parent.info.run_id, "accuracy")
    assert sorted(p.step for p in per_trial) == [1, 2]
    assert {p.step: p.value for p in per_trial} == pytest.approx({i: search.trials["accuracy"][i] for i in (1, 2)})
    assert parent.data.tags["tfbarrier.best_run_id"] == trials[search.best_trial].info.run_id


# ---- a tracking server --------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on 127.0.0.1 with a SQLite store and an artifact directory of its own, started for
    this module and stopped after it; (its URI, its artifact directory)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = open(root / "server.log", "w")
    process = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{root / 'store.db'}", "--artifacts-destination", str(root / "artifacts"),
         "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
        time.sleep(0.5)
    yield uri, root / "artifacts"
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)
    log.close()
    assert process.returncode is not None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{uri}/health", timeout=2)


def test_a_fit_logs_to_the_tracking_server_named_by_MLFLOW_TRACKING_URI(spark, digits_df, digits, server,
                                                                       monkeypatch):
    uri, artifacts = server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert mlflow.get_tracking_uri() == uri
    result = tfbarrier.fit(digits_df, digits_cnn(), epochs=2, mlflow=True, **FIT)  # the default experiment
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs(["0"])
    assert [run.info.run_id for run in runs] == [result.mlflow_run_id]
    assert runs[0].info.status == "FINISHED" and runs[0].data.params["epochs"] == "2"
    for name, values in result.history.items():
        points = client.get_metric_history(result.mlflow_run_id, name)
        assert [p.step for p in points] == [1, 2] and [p.value for p in points] == pytest.approx(values), name
    loaded = mlflow.keras.load_model(f"runs:/{result.mlflow_run_id}/model")
    x = held_out_images(digits)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), result.model.predict(x, verbose=0), rtol=1e-5, atol=1e-5)
    assert any(name.endswith(".keras") for _, _, names in os.walk(artifacts) for name in names)  # through the server
