"""What a fit's run and a search's run both do with MLflow: start a run (or continue one), log its
parameters and tags, end it. Once a run exists, MLflow's errors are TrackingWarnings, never the call's.
"""

import json
import warnings

TAG_LIMIT = 5000  # characters of an error kept in a tag (MLflow takes 8000)


class TrackingWarning(UserWarning):
    """MLflow did not take something a run was to log; the fit's result is unaffected."""


def start_run(target):
    """(the run's id, whether this call started it): target's run, or a new one with MLflow's context tags
    (user, source, git commit), as mlflow.start_run() would tag it."""
    if target.run_id is not None:
        return target.run_id, False
    from mlflow.tracking.context.registry import resolve_tags

    return target.client.create_run(target.experiment_id, tags=resolve_tags()).info.run_id, True


def end_run(client, run_id, status, owned=True):
    """End a run that this call owns with ``status``."""
    if owned:
        try:
            client.set_terminated(run_id, status)
        except Exception as error:  # noqa: BLE001
            warn_not_taken(f"the run's end ({status})", error)


def end_status(error):
    return "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"


def error_summary(error):
    return f"{type(error).__name__}: {error}"[:TAG_LIMIT]


def warn_not_taken(what, error):
    warnings.warn(f"MLflow did not take {what}: {type(error).__name__}: {error}", TrackingWarning, stacklevel=3)


def run_tags(values):
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)) for k, v in values.items()]


def log_params(client, run_id, params):
    """Log ``params``; a run continued with other values for some of them keeps its own (a warning)."""
    from mlflow.entities import Param

    try:
        client.log_batch(run_id, params=[Param(k, v if isinstance(v, str) else "None" if v is None
                                               else json.dumps(v, default=str)) for k, v in params.items()])
    except Exception as error:  # noqa: BLE001
        warn_not_taken(f"the parameters {sorted(params)}", error)
