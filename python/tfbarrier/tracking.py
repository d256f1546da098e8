"""Experiment tracking with MLflow, from the driver: ``fit(mlflow=...)`` logs one run, ``tune(mlflow=...)``
a parent run with a nested run per trial.

MLflow is imported here only, and only when ``mlflow=`` asks for it; the tasks and the training
processes never import it. A fit's run gets its parameters when the barrier stage is submitted; a
metric point per epoch (step = the epoch, from 1) as the chief's epoch messages reach the driver
through its link (a thread of its own logs them, so a slow tracking server never holds up the link);
at the end, the history of the epochs that did not come live (no driver link), the timings, workers
and attempts, the trained model as an MLflow model and the curves' figure. Once its run exists,
MLflow's errors are warnings: tracking never fails a fit that trained.

A run that the call started is ended by it (FINISHED, FAILED, or KILLED on Ctrl-C); a run that it
continues (the active run, a run id, an ``mlflow.ActiveRun``) is left to its owner, with the error in
its tags.
"""

import contextlib
import dataclasses
import importlib.metadata
import json
import os
import queue
import re
import tempfile
import threading
import time
import warnings

from .errors import InvalidArgumentError

INSTALL_HINT = "pip install tfbarrier[mlflow]"
RUN_ID = re.compile(r"[0-9a-f]{32}")  # what MLflow's run ids look like; any other string names an experiment
MODEL_NAME = "model"  # the trained model's name in its run
TAG_LIMIT = 5000  # characters of an error kept in a tag (MLflow takes 8000)
_PYPLOT = threading.Lock()  # pyplot's figures are global state; tune's trials end in threads of their own


class TrackingWarning(UserWarning):
    """MLflow did not take something a run was to log; the fit's result is unaffected."""


@dataclasses.dataclass
class Target:
    """Where ``mlflow=`` says to log: an existing run to continue, or an experiment to start one in."""

    client: object  # mlflow.MlflowClient, for the tracking URI in force when the call started
    run_id: str = None
    experiment_id: str = None


def resolve(value, name="mlflow"):
    """The Target of fit's or tune's ``mlflow`` argument, or None when tracking is off (None, False).
    True: the active run, else a new run in MLflow's current experiment; a run id (32 hex digits) or an
    ``mlflow.ActiveRun``: that run; any other string: a new run in the experiment of that name (created
    if missing). Raises InvalidArgumentError, before any Spark job, for other values and without MLflow."""
    if value is None or value is False:
        return None
    mlflow = _import_mlflow(name)
    client = mlflow.MlflowClient()
    if isinstance(value, mlflow.ActiveRun):
        return Target(client, run_id=value.info.run_id)
    if value is True:
        active = mlflow.active_run()
        if active is not None:
            return Target(client, run_id=active.info.run_id)
        return Target(client, experiment_id=_current_experiment_id())
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(f"{name} must be True, an experiment's name, a run id or an mlflow.ActiveRun "
                                   f"(None or False: no tracking), got {value!r}")
    if RUN_ID.fullmatch(value):
        try:
            client.get_run(value)
        except mlflow.exceptions.MlflowException as exc:
            raise InvalidArgumentError(f"{name}={value!r} looks like a run id, but MLflow has no such run "
                                       f"({client.tracking_uri}): {exc.message}") from None
        return Target(client, run_id=value)
    return Target(client, experiment_id=_experiment_id(client, value, name))


def _import_mlflow(name):
    try:
        import mlflow
    except ImportError as exc:
        raise InvalidArgumentError(f"{name}= logs to MLflow, which is not installed: {INSTALL_HINT}") from exc
    return mlflow


def _current_experiment_id():
    """The experiment ``mlflow.start_run()`` would start a run in: mlflow.set_experiment's, else
    MLFLOW_EXPERIMENT_NAME / MLFLOW_EXPERIMENT_ID's, else the default. MLflow has no public call for it."""
    from mlflow.tracking.fluent import _get_experiment_id

    return _get_experiment_id()


def _experiment_id(client, experiment, name):
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return client.create_experiment(experiment)
    if found.lifecycle_stage != "active":
        raise InvalidArgumentError(f"{name}={experiment!r}: that MLflow experiment is deleted; restore it "
                                   "(mlflow.MlflowClient().restore_experiment) or name another")
    return found.experiment_id


def _start(target):
    """(the run's id, whether this call started it): target's run, or a new one with MLflow's context tags
    (user, source, git commit), as mlflow.start_run() would tag it."""
    if target.run_id is not None:
        return target.run_id, False
    from mlflow.tracking.context.registry import resolve_tags

    return target.client.create_run(target.experiment_id, tags=resolve_tags()).info.run_id, True


def _end(client, run_id, status, owned=True):
    """End a run that this call owns with ``status``."""
    if owned:
        try:
            client.set_terminated(run_id, status)
        except Exception as error:  # noqa: BLE001
            _warn(f"the run's end ({status})", error)


def _end_status(error):
    return "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"


def _summary(error):
    return f"{type(error).__name__}: {error}"[:TAG_LIMIT]


def _warn(what, error):
    warnings.warn(f"MLflow did not take {what}: {type(error).__name__}: {error}", TrackingWarning, stacklevel=3)


def _tags(values):
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)) for k, v in values.items()]


def _log_params(client, run_id, params):
    """Log ``params``; a run continued with other values for some of them keeps its own (a warning)."""
    from mlflow.entities import Param

    try:
        client.log_batch(run_id, params=[Param(k, v if isinstance(v, str) else "None" if v is None
                                               else json.dumps(v, default=str)) for k, v in params.items()])
    except Exception as error:  # noqa: BLE001
        _warn(f"the parameters {sorted(params)}", error)


# ---- fit --------------------------------------------------------------------------------------------

FIT_PARAMS = ("epochs", "batch_size", "steps_per_epoch", "seed", "data_seed", "shuffle", "shuffle_buffer",
              "tf_threads", "steps_per_execution", "communication", "validation_split", "validation_freq",
              "class_weight", "checkpoint_dir", "checkpoint_every", "save_best")  # a FitJob's fields


def fit_params(job, **arguments):
    """The parameters of a fit's run: the arguments that shaped its training, from ``job`` (a FitJob)
    and ``arguments`` (fit's own: num_workers...), and what it ran with."""
    from . import __version__

    layout = job.layout
    return {**{name: getattr(job, name) for name in FIT_PARAMS},
            "features": list(layout.features), "label": layout.label, "sample_weight": layout.weight,
            "validation_data": job.validation_column, "model_kind": job.model.flavor, **arguments,
            "tfbarrier_version": __version__, "tensorflow_version": _version("tensorflow", "tensorflow-cpu")}


def _version(*distributions):
    for distribution in distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def model_params(model):
    """The model's size and optimizer, as parameters; none for a model function (until it is trained),
    nor for what a model does not tell (a custom optimizer without a config)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not hasattr(model, "count_params"):
        return {}
    described = {"optimizer": type(optimizer).__name__}
    try:
        described["model_parameters"] = model.count_params()
        rate = optimizer.get_config().get("learning_rate")  # a number, or a schedule's config
        described["optimizer_learning_rate"] = rate.get("class_name", rate) if isinstance(rate, dict) else rate
    except Exception:  # noqa: BLE001 - optional details
        pass
    return described


class _MetricWriter:
    """Logs metric points from a thread of its own: the driver link's thread only hands them over."""

    def __init__(self, client, run_id):
        self.errors = []
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write, args=(client, run_id), name="tfbarrier-mlflow",
                                        daemon=True)
        self._thread.start()

    def put(self, step, values, at):
        self._queue.put((step, values, at))

    def _write(self, client, run_id):
        from mlflow.entities import Metric

        while (item := self._queue.get()) is not None:
            step, values, at = item
            try:
                client.log_batch(run_id, metrics=[Metric(k, float(v), int(at * 1000), step)
                                                  for k, v in values.items() if v is not None])
            except Exception as error:  # noqa: BLE001 - reported once the fit ends
                self.errors.append(error)

    def close(self):
        """Wait until every point handed over is logged."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


class FitRun:
    """One fit's run: ``on_progress`` takes the chief's progress messages while the stage runs,
    ``log_result`` the FitResult, ``fail`` the error."""

    def __init__(self, target, params, model=None, batch_size=None):
        described = model_params(model)
        self._model_described = bool(described)
        self.client = target.client
        self.run_id, self.owned = _start(target)
        self.batch_size = batch_size
        self.logged_steps = set()  # epochs (from 1) handed to the writer as they came
        self._mark = None  # (steps, time) of the chief's report the next epoch's samples/s counts from
        _log_params(self.client, self.run_id, {**params, **described})
        self._writer = _MetricWriter(self.client, self.run_id)

    def on_progress(self, message):
        """A progress message of the chief (from the driver link's thread): an epoch's end logs its
        metrics and the samples per second since the previous report it counts from."""
        steps, at = message.get("steps", 0), message["received_at"]
        if steps and (self._mark is None or steps < self._mark[0]):  # the first step report (of an attempt)
            self._mark = (steps, at)
        if message.get("epoch") is None or not message.get("logs"):
            return
        values = dict(message["logs"])
        if self.batch_size and self._mark and steps > self._mark[0] and at > self._mark[1]:
            values["samples_per_second"] = (steps - self._mark[0]) * self.batch_size / (at - self._mark[1])
        self._mark = (steps, at)
        step = message["epoch"] + 1
        self.logged_steps.add(step)
        self._writer.put(step, values, at)

    def log_result(self, result):
        """Log what a fit that trained returns, then end the run if this fit started it. MLflow's errors
        are warnings."""
        self._finish_metrics(result.history)
        if not self._model_described:  # a model function's: known once trained
            _log_params(self.client, self.run_id, model_params(result.model))
        parts = (("the fit's timings, workers and attempts", lambda: self._log_details(result)),
                 ("the trained model", lambda: log_model(self.client, self.run_id, result.model)),
                 ("the curves' figure", lambda: self._log_figure(result)))
        for what, log in parts:
            try:
                log()
            except Exception as error:  # noqa: BLE001 - the fit trained: its result stands
                _warn(what, error)
        _end(self.client, self.run_id, "FINISHED", self.owned)

    def fail(self, error):
        """The fit failed: its error and attempts in the run's tags; a run it started ends FAILED (KILLED
        on Ctrl-C)."""
        self._writer.close()
        try:
            self.client.log_batch(self.run_id, tags=_tags({"tfbarrier.error": _summary(error),
                                                           **_attempt_tags(getattr(error, "attempts", None))}))
        except Exception as failure:  # noqa: BLE001 - the fit's own error is the one raised
            _warn("the fit's error", failure)
        _end(self.client, self.run_id, _end_status(error), self.owned)

    def _finish_metrics(self, history):
        """Wait for the live points, then log the epochs that did not come live (no driver link) from
        the history: each epoch once."""
        self._writer.close()
        if self._writer.errors:
            _warn(f"{len(self._writer.errors)} epochs' metrics", self._writer.errors[0])
        missing = [(index + 1, {name: values[index] for name, values in history.items()})
                   for index in range(len(next(iter(history.values()), []))) if index + 1 not in self.logged_steps]
        if missing:
            from mlflow.entities import Metric

            at = int(time.time() * 1000)
            try:
                self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), at, step) for step, values in missing
                                                            for k, v in values.items() if v is not None])
            except Exception as error:  # noqa: BLE001
                _warn("the history", error)

    def _log_details(self, result):
        tags = {f"tfbarrier.timing.{phase}": f"{seconds:.3f}" for phase, seconds in result.timings.items()
                if seconds is not None}
        self.client.log_batch(self.run_id, tags=_tags({**tags, **_attempt_tags(result.attempts)}))
        details = {"timings": result.timings, "workers": result.workers, "attempts": result.attempts,
                   "stopped_epoch": result.stopped_epoch, "saved": result.saved}
        self.client.log_text(self.run_id, json.dumps(details, indent=1, default=str), "tfbarrier/fit.json")

    def _log_figure(self, result):
        import matplotlib.pyplot as plt

        with _PYPLOT:
            figure = result.plot()
            try:
                self.client.log_figure(self.run_id, figure, "curves.png")
            finally:
                plt.close(figure)


def _attempt_tags(attempts):
    """How many times the stage was submitted, and each failed attempt's error."""
    if not attempts:
        return {}
    return {"tfbarrier.attempts": len(attempts),
            **{f"tfbarrier.attempt.{a['attempt']}.error": a["error"][:TAG_LIMIT] for a in attempts if a.get("error")}}


class _NoRun:
    """Tracking off."""

    run_id = None
    on_progress = None

    def log_result(self, result):
        pass


@contextlib.contextmanager
def fit_run(target, params, model=None, batch_size=None):
    """The FitRun of a fit, or a stand-in that logs nothing when ``target`` is None. An exception inside
    ends the run as failed and goes on."""
    if target is None:
        yield _NoRun()
        return
    run = FitRun(target, params, model, batch_size)
    try:
        yield run
    except BaseException as error:
        run.fail(error)
        raise


# ---- the model --------------------------------------------------------------------------------------

def log_model(client, run_id, model):
    """Log ``model`` as the run's MLflow model in its own Keras's flavor: ``mlflow.keras`` for Keras 3
    (``mlflow.keras.load_model`` returns a Keras 3 model), ``mlflow.tensorflow`` for tf_keras where
    ``tf.keras`` is tf_keras (``TF_USE_LEGACY_KERAS=1``; ``mlflow.tensorflow.load_model``). MLflow has no
    flavor for a tf_keras model beside Keras 3: there the run gets its ``.keras`` archive,
    ``model/model.keras``, which ``tf_keras.models.load_model`` reads."""
    import mlflow
    from mlflow.models import Model

    from .model_spec import keras_flavor

    flavor = keras_flavor(model)
    if flavor == "tf_keras" and not _tf_keras_is_tf_keras(model):
        with tempfile.TemporaryDirectory(prefix="tfbarrier-") as tmp:
            path = os.path.join(tmp, f"{MODEL_NAME}.keras")
            model.save(path)
            client.log_artifact(run_id, path, MODEL_NAME)
        client.set_tag(run_id, "tfbarrier.model", f"{MODEL_NAME}/{MODEL_NAME}.keras: tf_keras.models.load_model")
        return
    module, requirements = ((mlflow.keras, ("keras",)) if flavor == "keras3"
                            else (mlflow.tensorflow, ("tf-keras",)))
    requirements = [f"{name}=={version}" for name in (*requirements, "tensorflow", "tensorflow-cpu")
                    if (version := _version(name))]  # given, MLflow does not load the model to infer them
    # Created here so that it belongs to the run's experiment: MLflow would take the current one. Model.log
    # writes to the current tracking URI, which ``client`` was made for when the fit started.
    logged = client.create_logged_model(client.get_run(run_id).info.experiment_id, name=MODEL_NAME,
                                        source_run_id=run_id)
    Model.log(artifact_path=None, flavor=module, name=MODEL_NAME, run_id=run_id, model_id=logged.model_id,
              model=model, signature=_signature(model), pip_requirements=requirements)


def _tf_keras_is_tf_keras(model):
    """Whether tf.keras is tf_keras in this process (TF_USE_LEGACY_KERAS=1), as mlflow.tensorflow asks."""
    from tensorflow.keras.models import Model as TfKerasModel

    return isinstance(model, TfKerasModel)


def _signature(model):
    """float32 tensors of the model's input and output shapes, any batch size."""
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    def schema(shape):
        if not isinstance(shape, tuple):  # several outputs: not described
            return None
        return Schema([TensorSpec(np.dtype("float32"), tuple(-1 if d is None else d for d in shape))])

    return ModelSignature(inputs=schema(tuple(model.input_shape)), outputs=schema(tuple(model.output_shape)))


# ---- tune ---------------------------------------------------------------------------------------------

class SearchRun:
    """A search's parent run and its trials' nested runs. Its methods run on tune's calling thread; each
    trial's fit logs into its own run (``trial_started`` gives its id) from the trial's thread."""

    def __init__(self, target, params, metric):
        self.client, self.metric = target.client, metric
        self.run_id, self.owned = _start(target)
        self.experiment_id = self.client.get_run(self.run_id).info.experiment_id
        self.trials = {}  # trial -> its run id
        self._open, self._described = set(), set()
        _log_params(self.client, self.run_id, params)

    def trial_started(self, index):
        """A new run for trial ``index``, nested in the search's; its id is the trial fit's ``mlflow``."""
        from mlflow.tracking.context.registry import resolve_tags
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        tags = resolve_tags({MLFLOW_PARENT_RUN_ID: self.run_id, "tfbarrier.trial": str(index)})
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=f"trial-{index:03d}")
        self.trials[index] = run.info.run_id
        self._open.add(index)
        return run.info.run_id

    def trial_params(self, index, params):
        """The params ``build_model`` got (an optuna trial's, once it suggested them)."""
        if index in self._described or not params:
            return
        self._described.add(index)
        _log_params(self.client, self.trials[index], params)

    def trial_finished(self, index, params, row, error=None):
        """End trial ``index``'s run (FINISHED, or FAILED with its error) and log its ``metric`` in the
        parent run, at step = the trial."""
        self.trial_params(index, params)
        run_id = self.trials[index]
        value = row.get(self.metric)
        try:
            if error is not None:
                self.client.set_tag(run_id, "tfbarrier.error", row["error"][:TAG_LIMIT])
            elif value is not None:
                self.client.log_metric(self.run_id, self.metric, value, step=index)
        except Exception as failure:  # noqa: BLE001
            _warn(f"trial {index}'s outcome", failure)
        _end(self.client, run_id, "FINISHED" if error is None else "FAILED")
        self._open.discard(index)

    def log_result(self, result):
        """Tag the best trial, log its metric and the trials table; end the search's run if tune started it."""
        best = self.trials[result.best_trial]
        try:
            self.client.set_tag(best, "tfbarrier.best", "true")
            self.client.log_batch(self.run_id, tags=_tags({"tfbarrier.best_trial": result.best_trial,
                                                           "tfbarrier.best_run_id": best}))
            self.client.log_metric(self.run_id, f"best_{self.metric}",
                                   result.trials[self.metric].iloc[result.best_trial])
            self.client.log_text(self.run_id, result.trials.to_csv(index=False), "trials.csv")
        except Exception as error:  # noqa: BLE001
            _warn("the search's result", error)
        _end(self.client, self.run_id, "FINISHED", self.owned)

    def fail(self, error):
        """The search failed: trials still open end with it (their fits were cancelled), the error goes in
        the parent's tags, which ends FAILED (KILLED on Ctrl-C) if tune started it."""
        status = _end_status(error)
        for index in sorted(self._open):
            _end(self.client, self.trials[index], status)
        try:
            self.client.set_tag(self.run_id, "tfbarrier.error", _summary(error))
        except Exception as failure:  # noqa: BLE001
            _warn("the search's error", failure)
        _end(self.client, self.run_id, status, self.owned)


class _NoSearch:
    """Tracking off."""

    run_id = None

    def trial_started(self, index):
        return None

    def trial_params(self, index, params):
        pass

    def trial_finished(self, index, params, row, error=None):
        pass

    def log_result(self, result):
        pass


@contextlib.contextmanager
def search_run(target, params, metric):
    """The SearchRun of a tune, or a stand-in that logs nothing when ``target`` is None."""
    if target is None:
        yield _NoSearch()
        return
    run = SearchRun(target, params, metric)
    try:
        yield run
    except BaseException as error:
        run.fail(error)
        raise
