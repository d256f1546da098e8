"""run's and apply's driver side: the user's function in every worker of a barrier stage, with TF_CONFIG set
(spark/job.py's RunJob and ApplyJob). tfbarrier.run and tfbarrier.apply (api.py) are the faces."""

import time

from tfbarrier import checks
from tfbarrier.errors import InvalidArgumentError
from tfbarrier.spark import cluster, preflight, stage, transfer
from tfbarrier.spark.job import ApplyJob, RunJob, pickle_user_code


def run(train_fn, *, num_workers, args, kwargs, spark, tf_threads, timeout, allow_unencrypted, use_gpu, env, verbose):
    """tfbarrier.run's stage: worker 0's return value."""
    started = time.time()
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




def apply(data, fn, *, num_workers, columns, timeout, allow_unencrypted, use_gpu, env, verbose):
    """tfbarrier.apply's stage: the pandas DataFrames ``fn`` returned, in worker order."""
    from pyspark.sql.pandas.types import to_arrow_schema

    started = time.time()
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
