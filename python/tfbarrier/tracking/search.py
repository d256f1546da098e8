"""A search's MLflow runs: a parent run for ``tune``, a run nested in it per trial (which the trial's fit
continues), the best trial tagged and the trials table logged at the end.
"""

from tfbarrier.tracking.runs import (TAG_LIMIT, end_run, end_status, error_summary, log_params, run_tags, start_run,
                                     warn_not_taken)


class SearchRun:
    """A search's parent run and its trials' nested runs. Its methods run on tune's calling thread; each
    trial's fit logs into its own run (``trial_started`` gives its id) from the trial's thread."""

    def __init__(self, target, params, metric):
        self.client, self.metric = target.client, metric
        self.run_id, self.owned = start_run(target)
        self.experiment_id = self.client.get_run(self.run_id).info.experiment_id
        self.trials = {}  # trial -> its run id
        self._open, self._described = set(), set()
        log_params(self.client, self.run_id, params)

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
        log_params(self.client, self.trials[index], params)

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
            warn_not_taken(f"trial {index}'s outcome", failure)
        end_run(self.client, run_id, "FINISHED" if error is None else "FAILED")
        self._open.discard(index)

    def log_result(self, result):
        """Tag the best trial, log its metric and the trials table; end the search's run if tune started it."""
        best = self.trials[result.best_trial]
        try:
            self.client.set_tag(best, "tfbarrier.best", "true")
            self.client.log_batch(self.run_id, tags=run_tags({"tfbarrier.best_trial": result.best_trial,
                                                              "tfbarrier.best_run_id": best}))
            self.client.log_metric(self.run_id, f"best_{self.metric}",
                                   result.trials[self.metric].iloc[result.best_trial])
            self.client.log_text(self.run_id, result.trials.to_csv(index=False), "trials.csv")
        except Exception as error:  # noqa: BLE001
            warn_not_taken("the search's result", error)
        end_run(self.client, self.run_id, "FINISHED", self.owned)

    def fail(self, error):
        """The search failed: trials still open end with it (their fits were cancelled), the error goes in
        the parent's tags, which ends FAILED (KILLED on Ctrl-C) if tune started it."""
        status = end_status(error)
        for index in sorted(self._open):
            end_run(self.client, self.trials[index], status)
        try:
            self.client.set_tag(self.run_id, "tfbarrier.error", error_summary(error))
        except Exception as failure:  # noqa: BLE001
            warn_not_taken("the search's error", failure)
        end_run(self.client, self.run_id, status, self.owned)
