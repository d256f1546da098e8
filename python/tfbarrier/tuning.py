"""``tune``: many models at once, one ``fit`` per trial.

Trials run concurrently, as many as the cluster has task slots for (``workers_per_trial`` each,
``max_concurrent`` at most), each a fit of its own (its own barrier stage, ports, work directories)
started from a driver thread. ``build_model`` is called on the calling thread, one trial at a time,
so an R function passed through reticulate is only ever called where R runs. A trial that fails is
recorded with its error; the search goes on. One progress bar covers the search.
"""

import concurrent.futures
import copy
import dataclasses
import datetime
import itertools
import math
import os
import random
import time

from tfbarrier import checks, tracking
from tfbarrier.errors import InvalidArgumentError, TrialsFailedError
from tfbarrier.fitting.job import validates
from tfbarrier.progress import SearchBar
from tfbarrier.ranking import best_mode, better
from tfbarrier.spark import cluster

STATUS_OK, STATUS_FAILED = "ok", "failed"
TIME_COLUMNS = ("started_at", "finished_at", "training_started_at", "training_finished_at")


@dataclasses.dataclass
class TuneResult:
    """What ``tune`` returns.

    Attributes
    ----------
    trials : pandas.DataFrame
        One row per trial in the order of ``params``: trial, its params as columns, the final value of every
        metric in its history, status ("ok" or "failed"), error, seconds, started_at, finished_at (the
        driver's dispatch and return of its fit), training_started_at, training_finished_at (its chief's first
        step and end of training).
    best_params : dict
        The params of the best trial by ``metric``.
    best : FitResult
        The best trial's FitResult (``best.model``, ``best.history``...).
    best_trial : int
        The best trial's number (its row in ``trials``).
    metric, mode : str
        How trials were ranked.
    seed : int
        The data seed every trial used.
    mlflow_run_id : str or None
        With tune(mlflow=...), the id of the search's MLflow run (each trial's is nested in it).
    """

    trials: object
    best_params: dict
    best: object
    best_trial: int
    metric: str
    mode: str
    seed: int
    mlflow_run_id: str = None

    @property
    def best_model(self):
        """The best trial's trained model (``best.model``)."""
        return self.best.model

    def plot(self, path=None):
        """``metric`` per trial, the best one marked; saves a PNG to ``path`` when given; returns the
        matplotlib Figure."""
        import matplotlib.pyplot as plt

        done = self.trials[self.trials["status"] == STATUS_OK]
        figure, axis = plt.subplots(figsize=(max(4, 0.6 * len(self.trials)), 3.2))
        axis.bar(done["trial"].astype(str), done[self.metric])
        best = done.loc[done["trial"] == self.best_trial]
        axis.bar(best["trial"].astype(str), best[self.metric], color="tab:orange", label="best")
        axis.set_xlabel("trial")
        axis.set_ylabel(self.metric)
        axis.legend()
        figure.tight_layout()
        if path is not None:
            figure.savefig(path)
        return figure

    def __repr__(self):
        ok = int((self.trials["status"] == STATUS_OK).sum())
        value = self.trials[self.metric].iloc[self.best_trial]
        return (f"<TuneResult: {ok} of {len(self.trials)} trials ok; best {self.metric}={value:.4g} "
                f"with {self.best_params}>")


def parameter_sets(params):
    """A list of dicts: ``params`` itself, or the grid of a dict of lists."""
    if isinstance(params, dict):
        names = list(params)
        values = [v if isinstance(v, (list, tuple)) else [v] for v in params.values()]
        params = [dict(zip(names, combination)) for combination in itertools.product(*values)]
    if not isinstance(params, (list, tuple)) or not params or not all(isinstance(p, dict) for p in params):
        raise InvalidArgumentError(
            "params must be a non-empty list of dicts (one per trial), a dict of lists (their grid), or an optuna "
            f"study or sampler, got {type(params).__name__}")
    return [dict(p) for p in params]


class GridTrials:
    """Trials from a list of dicts: ``build_model`` gets trial i's dict."""

    kind = "grid"

    def __init__(self, params):
        self.params = parameter_sets(params)
        self.total = len(self.params)

    def start(self, index):
        return copy.deepcopy(self.params[index])  # build_model may change it: the table keeps the original

    def params_of(self, index):
        return self.params[index]

    def report(self, index, value):
        pass


class OptunaTrials:
    """Trials asked of an optuna study: ``build_model`` gets an ``optuna.Trial`` and suggests its params
    (``trial.suggest_float(...)``); each trial's final metric is told to the study (a failed one as
    failed), so its sampler proposes the next ones from the results so far."""

    def __init__(self, study, n_trials):
        self.study, self.total, self.trials = study, n_trials, {}
        self.kind = f"optuna {type(study.sampler).__name__}"

    def start(self, index):
        self.trials[index] = self.study.ask()
        return self.trials[index]

    def params_of(self, index):
        return dict(self.trials[index].params) if index in self.trials else {}

    def report(self, index, value):
        import optuna

        if index not in self.trials:
            return
        if value is None or math.isnan(value):
            self.study.tell(self.trials[index], state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(self.trials[index], value)


def trial_source(params, n_trials, mode):
    """GridTrials, or OptunaTrials for an optuna study or sampler (a study of direction ``mode`` is made
    for a sampler); ``n_trials`` is for optuna only."""
    module = type(params).__module__ or ""
    if not module.startswith("optuna"):
        if n_trials is not None:
            raise InvalidArgumentError("n_trials is for an optuna study or sampler: a grid has one trial per dict")
        return GridTrials(params)
    import optuna

    n_trials = checks.positive_int("n_trials", n_trials)
    direction = "minimize" if mode == "min" else "maximize"
    if isinstance(params, optuna.samplers.BaseSampler):
        return OptunaTrials(optuna.create_study(sampler=params, direction=direction), n_trials)
    if not isinstance(params, optuna.Study):
        raise InvalidArgumentError(f"params: an optuna Study or sampler, got {type(params).__name__}")
    if params.direction.name.lower() != direction:
        raise InvalidArgumentError(f"the study's direction is {params.direction.name.lower()} but mode is {mode!r} "
                                   f"for this metric: pass mode='{'max' if mode == 'min' else 'min'}'")
    return OptunaTrials(params, n_trials)


TRIAL_DIRECTORIES = ("checkpoint_dir", "save_to", "tensorboard_dir")  # fit's, one subdirectory per trial


def trial_directories(fit_kwargs, index):
    """``fit_kwargs`` with each directory of TRIAL_DIRECTORIES replaced by its ``trial-<index>``
    subdirectory: concurrent trials must not share checkpoints, saved models or logs."""
    return {k: (os.path.join(v, f"trial-{index:03d}") if k in TRIAL_DIRECTORIES and v is not None else v)
            for k, v in fit_kwargs.items()}


def _final_metrics(history):
    """The last value of every metric in ``history`` (val_* may be None between validations)."""
    final = {}
    for name, values in history.items():
        present = [v for v in values if v is not None]
        final[name] = present[-1] if present else math.nan
    return final


def _training_interval(result):
    """When the trial's chief trained, by its own clock (None for a failed trial)."""
    chief = result.workers[0] if result else {}
    return {f"training_{name}_at": None if chief.get(key) is None else datetime.datetime.fromtimestamp(chief[key])
            for name, key in (("started", "first_step_at"), ("finished", "finished_at"))}


def _trial_row(index, params, started, result=None, error=None):
    """Trial ``index``'s row of the trials table, as it ends now with ``result`` or ``error``."""
    finished = time.time()
    return {"trial": index, **params, **(_final_metrics(result.history) if result else {}),
            "status": STATUS_OK if error is None else STATUS_FAILED,
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "seconds": finished - started, "started_at": datetime.datetime.fromtimestamp(started),
            "finished_at": datetime.datetime.fromtimestamp(finished), **_training_interval(result)}


def run_trials(data, build_model, trials, fit, fit_kwargs, concurrency, metric, mode, verbose, search):
    """Run one ``fit(data, build_model(trials.start(i)), **fit_kwargs)`` per trial i of ``trials``
    (GridTrials or OptunaTrials), ``concurrency`` at a time, each logged to its run of ``search``
    (tracking.search_run's). Returns (rows of the trials table, index of the best trial or None, its
    FitResult)."""
    rows = [None] * trials.total
    improves, best = better(mode), [None, None]  # index, FitResult
    bar = SearchBar(trials.total, verbose)

    def finish(index, started, result=None, error=None):
        """Record trial ``index`` in ``rows``, keep it if it is the best so far, and show it."""
        params = trials.params_of(index)
        rows[index] = row = _trial_row(index, params, started, result, error)
        search.trial_finished(index, params, row, error)
        value = row.get(metric)
        trials.report(index, value)
        if value is not None and not math.isnan(value) and (best[0] is None or improves(value, rows[best[0]][metric])):
            best[:] = index, result
        outcome = row["error"] if error else f"{metric}={value:.4f}" if value is not None else f"no {metric}"
        bar.trial_done(f"trial {index} {params}: {outcome} ({row['seconds']:.1f} s)",
                       None if best[0] is None else f"{metric}={rows[best[0]][metric]:.4f}")

    def train(index, model, run_id):
        return fit(data, model, verbose=0, mlflow=run_id, **trial_directories(fit_kwargs, index))

    waiting = list(range(trials.total))
    running = {}  # future -> (trial, started)
    pool = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="tfbarrier-trial")
    try:
        while waiting or running:
            while waiting and len(running) < concurrency:
                index, started = waiting.pop(0), time.time()
                run_id = search.trial_started(index)
                try:
                    model = build_model(trials.start(index))  # here, on the calling thread: R functions too
                except Exception as error:  # a failed trial: recorded, the search goes on
                    finish(index, started, error=error)
                    continue
                search.trial_params(index, trials.params_of(index))
                running[pool.submit(train, index, model, run_id)] = index, started
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                index, started = running.pop(future)
                error = future.exception()
                finish(index, started, None if error else future.result(), error)
    except BaseException:  # Ctrl-C, or an error here: stop the running trials, start no more
        if running:
            cluster.cancel_all_jobs(data.sparkSession)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
    return rows, best[0], best[1]


def check_arguments(data, build_model, params, n_trials, metric, mode, workers_per_trial, max_concurrent, fit_kwargs,
                    fit):
    """(the trials, mode as "min"/"max", concurrency), or an error before any trial."""
    data = checks.spark_dataframe(data)
    if not callable(build_model):
        raise InvalidArgumentError(f"build_model must be a function of one dict of params, got "
                                   f"{type(build_model).__name__}")
    if not isinstance(metric, str) or not metric:
        raise InvalidArgumentError(f"metric must be the name of a metric such as 'val_loss', got {metric!r}")
    mode = best_mode(metric, mode, "mode")
    trials = trial_source(params, n_trials, mode)
    if metric.startswith("val_") and not validates(fit_kwargs.get("validation_data") is not None,
                                                   fit_kwargs.get("validation_split")):
        raise InvalidArgumentError(f"metric={metric!r} is a validation metric: pass validation_data= or "
                                   "validation_split=, or rank the trials by a training metric such as 'loss'")
    workers_per_trial = checks.positive_int("workers_per_trial", workers_per_trial)
    max_concurrent = checks.positive_int("max_concurrent", max_concurrent, allow_none=True)
    checks.no_unknown_arguments("tune", {k: v for k, v in fit_kwargs.items()
                                             if k not in _fit_parameters(fit)}, fit)
    return trials, mode, cluster.fits_at_once(data.sparkSession, workers_per_trial, trials.total, max_concurrent)


def _fit_parameters(fit):
    import inspect

    return set(inspect.signature(fit).parameters) - {"data", "model", "unknown"}


def tune(data, build_model, params, *, features, label, validation_data=None, validation_split=None,
         metric="val_loss", mode="auto", workers_per_trial=1, max_concurrent=None, epochs=1, batch_size=32,
         timeout=None, seed=None, n_trials=None, verbose=1, mlflow=None, **fit_kwargs):
    """Train one model per set of ``params`` on ``data``, several at once, and rank them by ``metric``.

    Parameters
    ----------
    data : pyspark.sql.DataFrame
        The training data, as in ``fit`` (every trial reads it: cache() it if it is costly).
    build_model : callable
        A function of one dict of params (an ``optuna.Trial`` with optuna) returning what ``fit`` takes as
        ``model``: a compiled Keras model (Keras 3 or tf_keras), or a function of no arguments that builds
        one with tf.keras in the workers (for custom layers). It is called on the driver, on the calling
        thread, once per trial.
    params : list of dict, dict of lists, or an optuna study or sampler
        One dict per trial, or a dict of lists whose grid (every combination) is the trials. With the
        ``optuna`` extra, an ``optuna.Study`` (its direction must agree with ``mode``) or a sampler
        (``optuna.samplers.TPESampler()``...): ``n_trials`` trials are asked of it, ``build_model``
        suggests each one's params (``trial.suggest_float("learning_rate", 1e-4, 1e-1, log=True)``) and
        each final ``metric`` is told back, so the sampler learns from the trials so far.
    features, label, validation_data, validation_split, epochs, batch_size
        As in ``fit``, the same for every trial.
    metric : str
        The metric trials are ranked by (its final value): "val_loss" by default, so a validation is
        needed; any name in the trials' history.
    mode : str
        "min", "max", or "auto": "max" for accuracy, AUC, precision and recall, else "min".
    workers_per_trial : int
        ``num_workers`` of each trial's fit.
    max_concurrent : int, optional
        Trials running at once; by default as many as the cluster's task slots allow
        (slots // workers_per_trial; one under Spark Connect, which does not tell its slots).
    timeout : float, optional
        Seconds each trial may take (fit's ``timeout``); a trial past it fails, the others go on.
    n_trials : int
        With optuna: how many trials to ask for.
    seed : int, optional
        fit's ``seed``, the same for every trial so that they differ in their params only (drawn once when
        not given; ``TuneResult.seed``).
    verbose : int
        0 silent; 1 one progress bar for the search (trials done, best so far); 2 also a line per trial.
    mlflow : bool, str or mlflow.ActiveRun, optional
        Log the search to MLflow, as fit's ``mlflow`` says (True, an experiment's name, a run id, an
        ``mlflow.ActiveRun``): a parent run for the search (its settings, ``metric`` per trial at step =
        the trial, ``best_<metric>``, the trials table) and a run nested in it per trial (its params, what a
        fit logs, its status and error); the best trial's run is tagged ``tfbarrier.best``. Default: off.
    **fit_kwargs
        Any other argument of ``fit`` (``callbacks``, ``shuffle``, ``sample_weight``, ``env``...);
        ``checkpoint_dir``, ``save_to`` and ``tensorboard_dir`` get a subdirectory per trial (``trial-007``).
        Ctrl-C, or an error in the search itself, cancels the session's running Spark jobs.

    Returns
    -------
    TuneResult
        Raises TrialsFailedError when every trial failed.
    """
    from tfbarrier.api import fit

    tracked = tracking.resolve(mlflow)
    fit_kwargs.update(features=features, label=label, validation_data=validation_data,
                      validation_split=validation_split, epochs=epochs, batch_size=batch_size, timeout=timeout,
                      num_workers=workers_per_trial)
    trials, mode, concurrency = check_arguments(data, build_model, params, n_trials, metric, mode,
                                                workers_per_trial, max_concurrent, fit_kwargs, fit)
    verbose = checks.verbosity(verbose)
    fit_kwargs["seed"] = seed = random.randrange(2**31) if seed is None else int(seed)
    described = {"metric": metric, "mode": mode, "search": trials.kind, "trials": trials.total, "epochs": epochs,
                 "batch_size": batch_size, "workers_per_trial": workers_per_trial, "concurrency": concurrency,
                 "seed": seed}
    with tracking.search_run(tracked, described, metric) as search:
        rows, best_index, best = run_trials(data, build_model, trials, fit, fit_kwargs, concurrency, metric, mode,
                                            verbose, search)
        result = _result(rows, best_index, best, trials, metric, mode, seed, search.run_id)
        search.log_result(result)
    return result


def _result(rows, best_index, best, trials, metric, mode, seed, mlflow_run_id):
    """The TuneResult of the trials' ``rows``, or TrialsFailedError when no trial has a ``metric``."""
    import pandas as pd

    table = pd.DataFrame(rows)
    if best is None:
        errors = "; ".join(f"trial {row['trial']}: {row['error']}" for row in rows if row["error"])
        if errors:
            raise TrialsFailedError(f"every trial failed: {errors}"[:4000], trials=table)
        reported = sorted(set(table.columns) - set(trials.params_of(0)) - {"trial", "status", "error", "seconds",
                                                                           *TIME_COLUMNS})
        raise TrialsFailedError(f"no trial reported metric={metric!r}; they reported {', '.join(reported)}: "
                                "pass one of those", trials=table)
    return TuneResult(trials=table, best_params=trials.params_of(best_index), best=best, best_trial=best_index,
                      metric=metric, mode=mode, seed=seed, mlflow_run_id=mlflow_run_id)
