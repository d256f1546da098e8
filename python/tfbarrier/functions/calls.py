"""``run`` and ``apply``: the user's function in every worker of a barrier stage, with TF_CONFIG set (the job
kinds of jobs.py), their faces and their driver side."""

import time

from tfbarrier import checks
from tfbarrier.errors import InvalidArgumentError
from tfbarrier.functions.jobs import ApplyJob, RunJob
from tfbarrier.spark import cluster, preflight, stage, transfer
from tfbarrier.user_code import pickle_user_code


def run(train_fn, *, num_workers=2, args=(), kwargs=None, spark=None, tf_threads=None, timeout=None,
        allow_unencrypted=False, use_gpu=False, env=None, verbose=1, **unknown):
    """Call ``train_fn(*args, **kwargs)`` in ``num_workers`` Spark barrier tasks at once, each in its own
    process with ``TF_CONFIG`` set for a multi-worker TensorFlow cluster, and return worker 0's (the
    chief's) return value. ``train_fn`` builds its own strategy, as in TensorFlow's multi-worker
    tutorial; ``tf.keras`` is tf_keras there. Its return value must be picklable. ``verbose=2`` shows
    every worker's printed lines on the driver as they come. ``timeout``, ``allow_unencrypted``,
    ``use_gpu`` and ``env`` are as in ``fit``."""
    started = time.time()
    checks.no_unknown_arguments("run", unknown, run)
    if not callable(train_fn):
        raise InvalidArgumentError(f"train_fn must be a function, got {type(train_fn).__name__}")
    num_workers = checks.positive_int("num_workers", num_workers)
    staging = preflight.stage_arguments(verbose, timeout=timeout)
    try:
        function = pickle_user_code((train_fn, tuple(args), dict(kwargs or {})), train_fn)
    except Exception as exc:
        raise InvalidArgumentError(f"train_fn and its arguments cannot be pickled: {exc}") from exc
    spark = preflight.spark_session(spark)
    basics, *_ = preflight.job_basics(spark, env, use_gpu, num_workers, allow_unencrypted, started, tf_threads)
    with transfer.JobFiles() as files:
        job = RunJob(function=files.add_bytes("function.pkl", function), **basics)
        frame = spark.range(0, num_workers, numPartitions=num_workers)
        results, _, _ = stage.run(frame, job, num_workers, files, **staging)
        return job.decode(results, files)


def apply(data, fn, *, num_workers=2, columns=None, timeout=None, allow_unencrypted=False, use_gpu=False,
          env=None, verbose=1, **unknown):
    """Call ``fn(partition, barrier)`` in ``num_workers`` Spark barrier tasks at once, each in its own
    process with ``TF_CONFIG`` set, on that task's partition of ``data`` (a pandas DataFrame); return
    the pandas DataFrames it returns, concatenated in worker order. ``barrier`` is a dict: address
    (this worker's host:port in TF_CONFIG), partition, num_workers, tf_config (the JSON string).
    ``columns`` ({name: Arrow type name, e.g. "string", "int32", "float64", "bool"}) selects and casts
    the result's columns. ``verbose``, ``timeout``, ``allow_unencrypted``, ``use_gpu`` and ``env`` are
    as in ``run``. This is what R's ``spark_tf_apply()`` runs an R closure through."""
    from pyspark.sql.pandas.types import to_arrow_schema

    started = time.time()
    checks.no_unknown_arguments("apply", unknown, apply)
    data = checks.spark_dataframe(data)
    if not callable(fn):
        raise InvalidArgumentError(f"fn must be a function of (partition, barrier), got {type(fn).__name__}")
    num_workers = checks.positive_int("num_workers", num_workers)
    staging = preflight.stage_arguments(verbose, timeout=timeout)
    output_schema = checks.output_schema(columns)
    basics, *_ = preflight.job_basics(data.sparkSession, env, use_gpu, num_workers, allow_unencrypted, started)
    frame = data if cluster.num_partitions(data) == num_workers else data.repartition(num_workers)
    with transfer.JobFiles() as files:
        job = ApplyJob(function=files.add_bytes("function.pkl", pickle_user_code(fn, fn)),
                       input_schema=to_arrow_schema(data.schema), output_schema=output_schema, **basics)
        results, _, _ = stage.run(frame, job, num_workers, files, **staging)
        return job.decode(results, files)
