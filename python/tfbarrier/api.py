"""The driver side: ``fit``, ``run`` and ``FitResult``."""

import dataclasses
import pickle
import time

import cloudpickle

from . import cluster, errors, task, validation
from .errors import InvalidArgumentError, PortClashError
from .job import JobSpec, pickle_user_code
from .model_spec import ModelSpec

PORT_CLASH_ATTEMPTS = 3
_WORKER_FIELDS = ("index", "host", "port", "rows", "steps", "steps_per_epoch", "checksum", "shard_checksum", "timings")


@dataclasses.dataclass
class FitResult:
    """What ``fit`` returns.

    model:    the trained Keras model, on the driver (same Keras as the model passed in; tf_keras for a
              model function)
    history:  per-epoch metrics as Keras reports them, e.g. {"loss": [...], "accuracy": [...]}
    timings:  seconds: data_shard, worker_start, rendezvous, strategy_and_model, first_step, training,
              time_to_first_step (from the fit() call), total (the chief's, plus the driver's total)
    workers:  one dict per worker: index, host, port, rows, steps, steps_per_epoch, checksum (of the
              final weights: equal on every worker when the replicas stayed in sync), shard_checksum
              (of the rows it trained on), timings
    """

    model: object
    history: dict
    timings: dict
    workers: list

    @property
    def num_workers(self):
        return len(self.workers)

    @property
    def epochs(self):
        return len(next(iter(self.history.values()), []))

    def __repr__(self):
        last = ", ".join(f"{k}={v[-1]:.4g}" for k, v in self.history.items() if v)
        return (
            f"<FitResult: {self.num_workers} workers, {self.epochs} epochs, {last}; "
            f"{self.timings.get('total', float('nan')):.1f} s total>"
        )


def _spark_session(spark):
    from pyspark.sql import SparkSession

    spark = spark or SparkSession.getActiveSession()
    if spark is None:
        raise InvalidArgumentError("no active SparkSession: start one first or pass spark=")
    return spark


def _launch(frame, job):
    """Run the barrier stage; the tasks' results in worker order. Port clashes are retried."""
    for attempt in range(1, PORT_CLASH_ATTEMPTS + 1):
        try:
            rows = frame.mapInArrow(task.barrier_function(job), task.RESULT_SCHEMA, barrier=True).collect()
        except Exception as exc:
            error = errors.decode(str(exc))
            if error is None:
                raise
            if isinstance(error, PortClashError) and attempt < PORT_CLASH_ATTEMPTS:
                continue
            raise error from None
        return [pickle.loads(row["payload"]) for row in sorted(rows, key=lambda r: r["index"])]


def fit(data, model, *, features, label, epochs=1, batch_size=32, num_workers=2, steps_per_epoch=None,
        seed=None, tf_threads=None):
    """Train a Keras model on a Spark DataFrame with ``num_workers`` Spark barrier tasks.

    Each task trains on its own partition of ``data`` in a TensorFlow process under
    ``MultiWorkerMirroredStrategy``; gradients are averaged across workers every step.

    Parameters
    ----------
    data : pyspark.sql.DataFrame
        The training data; it is never collected to the driver.
    model : Keras model or callable
        A compiled Keras model (Keras 3 or tf_keras) with one input, or a function of no arguments
        that builds and compiles one with ``tf.keras`` (use this for custom layers).
    features : str or list of str
        One array column (e.g. a flat image, reshaped to the model's input shape) or numeric columns.
    label : str
        A numeric column.
    epochs, batch_size : int
        As in Keras; ``batch_size`` is the global batch, split evenly across workers.
    num_workers : int
        Spark tasks (and TensorFlow workers) to train with; the cluster needs that many free slots.
    steps_per_epoch : int, optional
        Default: one pass over all rows at the global batch size. Every worker runs the same number.
    seed : int, optional
        Seeds weights' initialisation in the workers and the shuffling of each shard.
    tf_threads : int, optional
        Intra-op threads per training process. Default: the CPUs Spark gives each task.

    Returns
    -------
    FitResult
    """
    started = time.time()
    data = validation.spark_dataframe(data)
    num_workers = validation.positive_int("num_workers", num_workers)
    epochs = validation.positive_int("epochs", epochs)
    batch_size = validation.global_batch(validation.positive_int("batch_size", batch_size), num_workers)
    steps_per_epoch = validation.positive_int("steps_per_epoch", steps_per_epoch, allow_none=True)
    tf_threads = validation.positive_int("tf_threads", tf_threads, allow_none=True)
    seed = None if seed is None else int(seed)
    layout = validation.layout(data.schema, features, label)
    spec = ModelSpec.from_model(model)
    spec.check_loadable()
    frame = data.select(*layout.columns)
    validation.check_input_width(validation.feature_width(frame, layout), spec.input_shape)
    cluster.check_barrier_capacity(data.sparkSession, num_workers)
    if cluster.num_partitions(frame) != num_workers:
        frame = frame.repartition(num_workers)
    job = JobSpec(
        kind="fit", num_workers=num_workers, model=spec, layout=layout, epochs=epochs, batch_size=batch_size,
        steps_per_epoch=steps_per_epoch, seed=seed, tf_threads=tf_threads, started_at=started,
    )
    results = _launch(frame, job)
    chief = results[0]
    trained = spec.trained_model(model, chief.get("weights"), chief.get("archive"))
    timings = dict(chief["timings"])
    timings["time_to_first_step"] = chief["first_step_at"] - started
    timings["total"] = time.time() - started
    workers = [
        {key: r[key] for key in _WORKER_FIELDS} for r in results
    ]
    return FitResult(model=trained, history=chief["history"], timings=timings, workers=workers)


def run(train_fn, *, num_workers=2, args=(), kwargs=None, spark=None, tf_threads=None):
    """Call ``train_fn(*args, **kwargs)`` in ``num_workers`` Spark barrier tasks at once, each in its own
    process with ``TF_CONFIG`` set for a multi-worker TensorFlow cluster, and return worker 0's (the
    chief's) return value. ``train_fn`` builds its own strategy, as in TensorFlow's multi-worker
    tutorial; ``tf.keras`` is tf_keras there. Its return value must be picklable."""
    if not callable(train_fn):
        raise InvalidArgumentError(f"train_fn must be a function, got {type(train_fn).__name__}")
    num_workers = validation.positive_int("num_workers", num_workers)
    tf_threads = validation.positive_int("tf_threads", tf_threads, allow_none=True)
    spark = _spark_session(spark)
    try:
        function = pickle_user_code((train_fn, tuple(args), dict(kwargs or {})), train_fn)
    except Exception as exc:
        raise InvalidArgumentError(f"train_fn and its arguments cannot be pickled: {exc}") from exc
    cluster.check_barrier_capacity(spark, num_workers)
    job = JobSpec(kind="run", num_workers=num_workers, function=function, tf_threads=tf_threads,
                  started_at=time.time())
    frame = spark.range(0, num_workers, numPartitions=num_workers)
    results = _launch(frame, job)
    return cloudpickle.loads(results[0]["value"])
