"""A fit's MLflow run: its parameters when the stage is submitted, a metric point per epoch as the chief's
progress reaches the driver (logged by a thread of its own), and at the end the epochs that did not come
live, the timings, workers and attempts, the trained model and the curves' figure.
"""

import dataclasses
import json
import queue
import threading
import time

from tfbarrier.progress import samples_per_second
from tfbarrier.tracking.models import installed_version, log_model
from tfbarrier.tracking.runs import (TAG_LIMIT, end_run, end_status, error_summary, log_params, run_tags, start_run,
                                     warn_not_taken)

_PYPLOT = threading.Lock()  # pyplot's figures are global state; tune's trials end in threads of their own


def fit_params(job, **arguments):
    """The parameters of a fit's run: the arguments that shaped its training, from ``job`` (a FitJob: its fields
    marked tracked) and ``arguments`` (fit's own: num_workers...), and what it ran with."""
    from tfbarrier import __version__

    layout = job.layout
    recorded = [field.name for field in dataclasses.fields(job) if field.metadata.get("tracked")]  # fitting/job.py
    return {**{name: getattr(job, name) for name in recorded},
            "features": dict(zip(layout.inputs, layout.features)) if layout.inputs else list(layout.features),
            "label": dict(zip(layout.outputs, layout.labels)) if layout.outputs else layout.label,
            "sample_weight": layout.weight,
            "validation_data": job.has_validation_column, "model_kind": job.model.flavor, "exchange": job.exchange.name,
            **arguments,
            "tfbarrier_version": __version__,
            "tensorflow_version": installed_version("tensorflow", "tensorflow-cpu")}


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
        self.run_id, self.owned = start_run(target)
        self.batch_size = batch_size
        self.logged_steps = set()  # epochs (from 1) handed to the writer as they came
        self._mark = None  # (time, steps) of the chief's report the next epoch's samples/s counts from
        log_params(self.client, self.run_id, {**params, **described})
        self._writer = _MetricWriter(self.client, self.run_id)

    def on_progress(self, message):
        """A progress message of the chief (from the driver link's thread): an epoch's end logs its
        metrics and the samples per second since the previous report it counts from."""
        steps, at = message.get("steps", 0), message["received_at"]
        if steps and (self._mark is None or steps < self._mark[1]):  # the first step report (of an attempt)
            self._mark = (at, steps)
        if message.get("epoch") is None or not message.get("logs"):
            return
        values = dict(message["logs"])
        rate = samples_per_second(self._mark, at, steps, self.batch_size)
        if rate is not None:
            values["samples_per_second"] = rate
        self._mark = (at, steps)
        step = message["epoch"] + 1
        self.logged_steps.add(step)
        self._writer.put(step, values, at)

    def log_result(self, result):
        """Log what a fit that trained returns, then end the run if this fit started it. MLflow's errors
        are warnings."""
        self._finish_metrics(result.history)
        if not self._model_described:  # a model function's: known once trained
            log_params(self.client, self.run_id, model_params(result.model))
        parts = (("the fit's timings, workers and attempts", lambda: self._log_details(result)),
                 ("the trained model", lambda: log_model(self.client, self.run_id, result.model)),
                 ("the curves' figure", lambda: self._log_figure(result)))
        for what, log in parts:
            try:
                log()
            except Exception as error:  # noqa: BLE001 - the fit trained: its result stands
                warn_not_taken(what, error)
        end_run(self.client, self.run_id, "FINISHED", self.owned)

    def fail(self, error):
        """The fit failed: its error and attempts in the run's tags; a run it started ends FAILED (KILLED
        on Ctrl-C)."""
        self._writer.close()
        try:
            tags = {"tfbarrier.error": error_summary(error), **_attempt_tags(getattr(error, "attempts", None))}
            self.client.log_batch(self.run_id, tags=run_tags(tags))
        except Exception as failure:  # noqa: BLE001 - the fit's own error is the one raised
            warn_not_taken("the fit's error", failure)
        end_run(self.client, self.run_id, end_status(error), self.owned)

    def _finish_metrics(self, history):
        """Wait for the live points, then log the epochs that did not come live (no driver link) from
        the history: each epoch once."""
        self._writer.close()
        if self._writer.errors:
            warn_not_taken(f"{len(self._writer.errors)} epochs' metrics", self._writer.errors[0])
        missing = [(index + 1, {name: values[index] for name, values in history.items()})
                   for index in range(len(next(iter(history.values()), []))) if index + 1 not in self.logged_steps]
        if missing:
            from mlflow.entities import Metric

            at = int(time.time() * 1000)
            try:
                self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), at, step) for step, values in missing
                                                            for k, v in values.items() if v is not None])
            except Exception as error:  # noqa: BLE001
                warn_not_taken("the history", error)

    def _log_details(self, result):
        tags = {f"tfbarrier.timing.{phase}": f"{seconds:.3f}" for phase, seconds in result.timings.items()
                if seconds is not None}
        self.client.log_batch(self.run_id, tags=run_tags({**tags, **_attempt_tags(result.attempts)}))
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
