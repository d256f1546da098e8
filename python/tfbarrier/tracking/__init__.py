"""Experiment tracking with MLflow, from the driver: ``fit(mlflow=...)`` logs one run, ``tune(mlflow=...)``
a parent run with a nested run per trial.

MLflow is imported by the tracking modules only, and only when ``mlflow=`` asks for it; the tasks and
the training processes never import it. A fit's run gets its parameters when the barrier stage is
submitted; a metric point per epoch (step = the epoch, from 1) as the chief's epoch messages reach the
driver through its link (a thread of its own logs them, so a slow tracking server never holds up the
link); at the end, the history of the epochs that did not come live (no driver link), the timings,
workers and attempts, the trained model as an MLflow model and the curves' figure. Once its run exists,
MLflow's errors are warnings: tracking never fails a fit that trained.

A run that the call started is ended by it (FINISHED, FAILED, or KILLED on Ctrl-C); a run that it
continues (the active run, a run id, an ``mlflow.ActiveRun``) is left to its owner, with the error in
its tags.

This module is what ``fit`` and ``tune`` call: ``resolve`` (the ``mlflow`` argument), ``fit_params``,
``fit_run`` and ``search_run``. The runs are tracking_fit's FitRun and tracking_search's SearchRun, on
tracking_runs's calls; tracking_models logs the trained model.
"""

import contextlib
import dataclasses
import re

from tfbarrier.errors import InvalidArgumentError
from tfbarrier.tracking.fit import FitRun, fit_params, model_params
from tfbarrier.tracking.models import log_model
from tfbarrier.tracking.runs import TrackingWarning
from tfbarrier.tracking.search import SearchRun

__all__ = ["FitRun", "SearchRun", "Target", "TrackingWarning", "fit_params", "fit_run", "log_model", "model_params",
           "resolve", "search_run"]

INSTALL_HINT = "pip install tfbarrier[mlflow]"
RUN_ID = re.compile(r"[0-9a-f]{32}")  # what MLflow's run ids look like; any other string names an experiment


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
