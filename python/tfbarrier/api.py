"""The driver side of the three calls: ``fit``, ``run`` and ``apply``. Each checks its arguments
before any Spark job, makes its kind of job (fit_job.FitJob, job.RunJob, job.ApplyJob) and runs its
barrier stage (stage.run)."""

import functools
import random
import time

from . import (checks, cluster, fit_job, gpus, job_tls, memory, native_model, parquet_source, settings, stage,
               tracking, transfer)
from .environment import PythonEnv
from .errors import InvalidArgumentError
from .layouts import layout as features_layout
from .fit_job import VALIDATION_COLUMN, FitJob
from .job import ApplyJob, RunJob, pickle_user_code
from .results import FitResult
from .communication import RING
from .settings import STALL_TIMEOUT

PARTITION_KEY = "__tfbarrier_partition"  # with validation_data: the key that sends each row to its worker
# Data sources the tasks read themselves, tried in order: each plan(frame, partitions, layout, num_workers)
# returns None, or a source with a ``profile`` (checks.check_profile's) and ``batches(index, columns)``.
DIRECT_SOURCES = (parquet_source.plan,)

__all__ = ["FitResult", "apply", "fit", "run"]


def _training_frame(data, layout, num_workers, input_shape, validation_data=None):
    """(the DataFrame of the barrier stage, the direct source its tasks read (DIRECT_SOURCES) or None), once the
    data passed the checks. A plain Parquet scan is read by the tasks themselves and profiled from
    its footers (see parquet_source for which); any other DataFrame is profiled with one aggregate
    pass and streamed by Spark, repartitioned unless it has ``num_workers`` partitions, none of them
    empty. ``validation_data``, profiled too, joins the training rows marked by VALIDATION_COLUMN, in one
    shuffle (_with_validation_rows)."""
    frame = data.select(*layout.projection(data.sparkSession))
    partitions = cluster.num_partitions(frame)
    source = None if validation_data is not None else _direct_source(frame, partitions, layout, num_workers)
    profile = source.profile if source else checks.profile(frame, layout)
    checks.check_profile(profile, layout, num_workers, input_shape)
    if source:
        return data.sparkSession.range(0, num_workers, numPartitions=num_workers), source
    keep = partitions == num_workers and profile["nonempty_partitions"] == num_workers
    if validation_data is not None:
        return _with_validation_rows(frame, keep, validation_data, layout, num_workers, input_shape), None
    return (frame if keep else frame.repartition(num_workers)), None


def _direct_source(frame, partitions, layout, num_workers):
    """The first of DIRECT_SOURCES that can read ``frame`` without Spark, else None."""
    return next((source for source in (plan(frame, partitions, layout, num_workers) for plan in DIRECT_SOURCES)
                 if source is not None), None)


def _with_validation_rows(frame, keep, validation_data, layout, num_workers, input_shape):
    """The training rows and validation_data's in one DataFrame of ``num_workers`` partitions (one
    shuffle). Each side keeps its own partitioning when it has ``num_workers`` partitions (the
    training data's ``keep``; validation_data's may be empty or uneven: every worker validates
    however few rows it has); otherwise each of its partitions is dealt round-robin to the workers."""
    from pyspark.sql import functions as F

    held = validation_data.select(*layout.projection(validation_data.sparkSession))
    held = held.select(*[F.col(c).cast(frame.schema[c].dataType) for c in layout.columns])
    checks.check_profile(checks.profile(held, layout), layout, 1, input_shape, what="validation_data")
    keys = cluster.partition_keys(frame.sparkSession, num_workers)
    placed = [cluster.with_partition_key(part, PARTITION_KEY, keys, kept).withColumn(VALIDATION_COLUMN, F.lit(flag))
              for part, kept, flag in ((frame, keep, False),
                                       (held, cluster.num_partitions(held) == num_workers, True))]
    return placed[0].unionByName(placed[1]).repartition(num_workers, PARTITION_KEY).drop(PARTITION_KEY)


def _python_env(spark, env):
    """Check ``env`` and ship an archive environment to the executors."""
    if env is None:
        return None
    if not isinstance(env, PythonEnv):
        raise InvalidArgumentError(f"env must be a tfbarrier.PythonEnv or None, got {type(env).__name__}")
    if env.archive:
        cluster.add_archive(spark, env.archive)
    return env


def _job_basics(spark, env, use_gpu, num_workers, allow_unencrypted, started, tf_threads=None, over_ring=None):
    """What every job asks of the cluster before its stage, as the Job fields every kind shares: its Python environment
    (an archive is shipped), the GPU plan, encryption (refused unless allowed where workers talk through TensorFlow's
    server: all but a fit ``over_ring(GPUs per worker)``), the executors' Python and ``num_workers`` free slots.
    Returns (those fields, GPUs per worker, over the ring)."""
    tf_threads = checks.positive_int("tf_threads", tf_threads, allow_none=True)
    env = _python_env(spark, env)
    gpu_plan, gpus_per_worker = gpus.plan(spark, use_gpu, num_workers)
    ring = bool(over_ring and over_ring(gpus_per_worker))
    tls = job_tls.for_job(spark, allow_unencrypted, tensorflow_server=not ring)
    cluster.check_executor_python(spark)
    cluster.check_barrier_capacity(spark, num_workers)
    basics = {"env": env, "gpus": gpu_plan, "spare_idle_timeout": cluster.spare_idle_timeout(spark),
              "started_at": started, "tf_threads": tf_threads, "tls": tls}
    return basics, gpus_per_worker, ring


def _training_fields(epochs, batch_size, steps_per_epoch, seed, shuffle, shuffle_buffer, steps_per_execution,
                     communication, stall_timeout, tensorboard_dir, class_weight):
    """fit's plain training arguments, checked, as FitJob fields."""
    seed = None if seed is None else int(seed)
    return {"epochs": checks.positive_int("epochs", epochs), "batch_size": checks.positive_int("batch_size", batch_size),
            "steps_per_epoch": checks.positive_int("steps_per_epoch", steps_per_epoch, allow_none=True),
            "seed": seed, "data_seed": random.randrange(2**31) if seed is None else seed,  # the same on every attempt
            "shuffle": bool(shuffle), "shuffle_buffer": checks.positive_int("shuffle_buffer", shuffle_buffer, allow_none=True),
            "steps_per_execution": checks.steps_per_execution(steps_per_execution),
            "communication": checks.communication(communication),
            "stall_timeout": checks.positive_seconds("stall_timeout", stall_timeout),
            "tensorboard_dir": checks.directory("tensorboard_dir", tensorboard_dir),
            "class_weight": checks.class_weights(class_weight)}


def _validation_and_saving(validation_data, validation_split, validation_freq, features, label, sample_weight,
                           save_to, save_best, save_mode):
    """(validation_data checked, fit's validation and saving arguments checked, as FitJob fields)."""
    validation_data, validation_split, validation_freq = checks.validation_arguments(
        validation_data, validation_split, validation_freq, features, label, sample_weight)
    save_to, save_best, save_mode = checks.save_arguments(
        save_to, save_best, save_mode, fit_job.validates(validation_data is not None, validation_split))
    return validation_data, {"has_validation_column": validation_data is not None,
                             "validation_split": validation_split, "validation_freq": validation_freq,
                             "save_to": save_to, "save_best": save_best, "save_mode": save_mode}


def _stage_arguments(verbose, max_retries=0, timeout=None):
    """stage.run's arguments of a call, checked."""
    return {"verbose": checks.verbosity(verbose), "max_retries": checks.non_negative_int("max_retries", max_retries),
            "timeout": checks.positive_seconds("timeout", timeout)}


def _spark_session(spark):
    from pyspark.sql import SparkSession

    spark = spark or SparkSession.getActiveSession()
    if spark is None:
        raise InvalidArgumentError("no active SparkSession: start one first or pass spark=")
    return spark


def fit(data, model, *, features, label, epochs=1, batch_size=32, num_workers=2, steps_per_epoch=None,
        seed=None, shuffle=True, shuffle_buffer=None, tf_threads=None, callbacks=None, checkpoint_dir=None,
        max_retries=0, timeout=None, stall_timeout=STALL_TIMEOUT, allow_unencrypted=False, use_gpu=False, verbose=1,
        tensorboard_dir=None, env=None, validation_data=None, validation_split=None, validation_freq=1,
        sample_weight=None, class_weight=None, save_to=None, save_best=None, save_mode="auto",
        steps_per_execution="auto", communication=None, checkpoint_every=None, mlflow=None, **unknown):
    """Train a Keras model on a Spark DataFrame with ``num_workers`` Spark barrier tasks.

    Each task trains on its own partition of ``data`` in a TensorFlow process; gradients are averaged across
    workers every step over tfbarrier's ring (MultiWorkerMirroredStrategy's with GPUs, "ring" or "nccl").

    Parameters
    ----------
    data : pyspark.sql.DataFrame
        The training data; it is never collected to the driver. fit() makes one validation pass
        over it (rows, nulls, array lengths) before training: cache() it if it is costly to compute.
        A plain Parquet scan of local files (``spark.read.parquet(path)``, columns selected at most)
        is instead read by the tasks themselves with pyarrow and checked from the files' footers:
        each task reads its Spark partition's files when the scan has ``num_workers`` partitions,
        else a contiguous, even share of the rows (README, "Large data and images").
    model : Keras model or callable
        A compiled Keras model (Keras 3 or tf_keras) with one input, or a function of no arguments
        that builds and compiles one with ``tf.keras`` (use this for custom layers).
    features : str, list of str or dict
        One array column (e.g. a flat image, reshaped to the model's input shape), numeric columns, or
        one binary column of encoded images (PNG, JPEG, GIF, BMP: ``spark.read.format("binaryFile")``'s
        ``content``), decoded in the training processes and resized to the model's (height, width,
        channels) input as float32 in 0-255, like ``keras.utils.image_dataset_from_directory``. For a
        Keras 3 model of several inputs, {input name: column}: each a numeric column, an array column of
        numbers or a Spark ML vector; integers stay integers (int64).
    label : str or dict
        A numeric column; for a Keras 3 model of several outputs, {output name: column}.
    epochs, batch_size : int
        As in Keras; ``batch_size`` is the global batch, split evenly across workers.
    num_workers : int
        Spark tasks (and TensorFlow workers) to train with; the cluster needs that many free slots.
    steps_per_epoch : int, optional
        Default: one pass over all rows at the global batch size. Every worker runs the same number.
    seed : int, optional
        Seeds weights' initialisation in the workers and the shuffling of each shard.
    shuffle : bool
        Shuffle each shard every pass (default). False keeps partition order, for reproducible runs.
    shuffle_buffer : int, optional
        Rows each worker mixes at a time when ``shuffle`` is on. A shard is streamed, never held whole:
        each pass reads its record batches (about 4 MB each) in a fresh random order and draws rows
        from a buffer of this many. Memory: this many rows' bytes. Default: 10,000 rows, but no more
        than 64 MB of them (for example 10,000 rows of 784 float32, or about 670 encoded images of 100 kB).
    tf_threads : int, optional
        Intra-op threads per training process. Default: the CPUs Spark gives each task.
    callbacks : callable, optional
        A function of no arguments, called in every training process, returning a list of
        ``tf.keras`` (tf_keras) callbacks; ``TF_CONFIG`` says which worker it runs in and
        ``TFBARRIER_ATTEMPT`` which submission. Also the hook for fault-injection tests.
    checkpoint_dir : str, optional
        A directory every worker can reach (a shared file system; any local path in local mode).
        Training state (the model, its optimizer, the step, each worker's position in its data and the
        epoch's running metrics) is saved there at the end of each epoch, and every ``checkpoint_every``
        steps, with the epoch log; a resubmitted job (``max_retries``), or a later fit with the same
        directory after a failure, resumes at the step after the last save: no step is repeated or
        skipped. Removed when the fit ends.
    checkpoint_every : int or str, optional
        With ``checkpoint_dir``: also save every this many steps, or every so long ("90s", "10min",
        "2h": that many steps as the slowest worker takes them, measured at the start). A save comes at
        the end of a call into TensorFlow (``steps_per_execution``; "auto" runs at most this many steps
        per call). Default: at the end of each epoch only.
    max_retries : int
        Resubmit the job this many times after a retryable failure (a killed training process, a lost
        executor); errors in the model or the data are never retried. Port clashes are retried apart.
    timeout : float, optional
        Seconds for the whole fit, retries included; the job is cancelled and JobTimeoutError raised.
    stall_timeout : float, optional
        Seconds a training process may go without progress (one heartbeat a second while it steps)
        before the fit fails with WorkerStalledError. None disables the watchdog.
    allow_unencrypted : bool
        Where Spark encrypts, tfbarrier's own traffic (link, ring) is TLS, but a fit under the strategy
        ("ring", "nccl") talks TensorFlow's plain gRPC: it runs only with this True.
    use_gpu : bool
        Give each training process the GPUs Spark assigned to its task (README, "GPUs").
    verbose : int
        0 silent; 1 a live progress bar and a line per epoch; 2 also every worker's events and output lines.
    tensorboard_dir : str, optional
        The chief writes TensorBoard logs there.
    env : PythonEnv, optional
        The training processes' Python environment (README, "Python environments on the executors");
        default: the executors' own Python.
    validation_data : pyspark.sql.DataFrame, optional
        Rows to evaluate the model on after each epoch, with the training data's feature and label
        columns. Shared among the workers with the training rows (never collected; partition i to
        worker i when it has ``num_workers`` partitions, else each partition dealt round-robin); each validation
        evaluates every row exactly once across all workers. ``val_loss`` and ``val_<metric>`` go into
        ``history``, the epoch lines and the logs callbacks see (EarlyStopping, ReduceLROnPlateau).
    validation_split : float, optional
        Instead of ``validation_data``: this fraction of each worker's rows is held out, drawn with
        ``seed`` (the same rows on every epoch and every retry).
    validation_freq : int
        Validate after every this many epochs (``val_*`` is None in ``history`` for the others).
    sample_weight : str, optional
        A numeric column: each row's weight in the loss (and in ``weighted_metrics``), in training and
        validation, as Keras's ``sample_weight``.
    class_weight : dict, optional
        {class id: weight} for training, as in Keras: each row's loss is weighted by its class's weight
        (times its sample weight); classes not listed weigh 1.
    save_to : str, optional
        A directory every worker can reach (a shared file system; any local path in local mode). After
        each epoch the chief writes the model there as a ``.keras`` archive the model's own Keras loads
        (``keras.saving.load_model``, or tf_keras's for a model function), ``epoch-001.keras`` and so on,
        with ``saved.json`` listing them and each epoch's metrics: a long fit leaves usable models even
        if the driver dies. ``FitResult.saved`` lists them.
    save_best : str, optional
        With ``save_to``: save only when this metric (e.g. "val_loss", "val_accuracy", "loss") improves,
        to ``best.keras``; epochs without validation (``validation_freq``) are skipped.
    save_mode : str
        "min", "max", or "auto" (default): "max" for metrics named after accuracy, AUC, precision or
        recall, "min" otherwise, as Keras's ``ModelCheckpoint``.
    steps_per_execution : "auto", int or None
        Training steps per call from Python into TensorFlow (Keras's ``steps_per_execution``): fewer round
        trips per step; batch-level callbacks then run once per call. "auto" (default): the first calls
        run one step each and are timed, then every worker runs as many steps per call as last about half
        a second (at most 100, at most an epoch), or what the model was compiled with if that is not 1.
        None: as the model was compiled. ``FitResult.workers`` reports the count each worker ended with.
    communication : dict, optional
        ``implementation``: "auto" (tfbarrier's ring; the strategy for several GPUs per worker), "tfbarrier" (the
        ring), "ring" or "nccl" (MultiWorkerMirroredStrategy's collectives); ``bytes_per_pack`` (all-reduces of
        about this size; 0: one of every gradient), ``timeout_seconds``; ``compression`` "fp16" all-reduces the
        gradients in float16 (half the bytes; about three significant digits, float16's range), "none"
        (default) in float32. Default: packs of 16 MB, no compression. ``FitResult.workers`` reports it.
    mlflow : bool, str or mlflow.ActiveRun, optional
        Log the fit to MLflow (``pip install tfbarrier[mlflow]``), from the driver: True logs to the active
        run, else to a new run in the current experiment; a string names the experiment of a new run (a
        run id continues that run, as an ``mlflow.ActiveRun`` does). The run gets the arguments that shaped
        the training, the model's size and optimizer, a metric point per epoch as the epochs end (step =
        the epoch, from 1: ``loss``, ``val_*``, ``samples_per_second``), the timings, workers and retries,
        the trained model as an MLflow model (README, "Experiment tracking") and ``plot()``'s figure. A run
        the fit started ends FINISHED, or FAILED with the error. ``FitResult.mlflow_run_id`` is its id.
        MLflow's tracking URI is its own (``MLFLOW_TRACKING_URI``, ``mlflow.set_tracking_uri``). Default: off.

    Returns
    -------
    FitResult
    """
    started = time.time()
    checks.no_unknown_arguments("fit", unknown, fit)
    tracked = tracking.resolve(mlflow)
    data = checks.spark_dataframe(data)
    num_workers = checks.positive_int("num_workers", num_workers)
    staging = _stage_arguments(verbose, max_retries, timeout)
    training = _training_fields(epochs, batch_size, steps_per_epoch, seed, shuffle, shuffle_buffer,
                                steps_per_execution, communication, stall_timeout, tensorboard_dir, class_weight)
    layout = features_layout(data.schema, features, label, weight=sample_weight)
    validation_data, held_out_and_saved = _validation_and_saving(
        validation_data, validation_split, validation_freq, features, label, sample_weight, save_to, save_best, save_mode)
    with transfer.JobFiles() as files:
        spark = data.sparkSession
        spec = native_model.spec_for_fit(model, files, spark.conf.get(settings.KERAS3_TRAINING_CONF, "auto"),
                                         named=layout.named)
        if getattr(spec, "native", False):
            _native_options(communication, class_weight if layout.outputs else None)
        over_ring = functools.partial(_over_ring, spec, training["communication"], spark, allow_unencrypted)
        callbacks = checks.callbacks_function(callbacks)
        checkpoint_dir = checks.directory("checkpoint_dir", checkpoint_dir)
        checkpoint_every = checks.checkpoint_every(checkpoint_every, checkpoint_dir)
        basics, gpus_per_worker, ring = _job_basics(spark, env, use_gpu, num_workers, allow_unencrypted, started,
                                                    tf_threads, over_ring)
        gpus.check_batch(training["batch_size"], num_workers, gpus_per_worker, ring)
        memory.check_on_driver(spark, spec.size, training["batch_size"] // num_workers, num_workers, ring)
        frame, source = _training_frame(data, layout, num_workers, spec.input_shape, validation_data)
        job = FitJob(model=spec, layout=layout, source=source,
                     callbacks=callbacks and files.add_bytes("callbacks.pkl", callbacks), checkpoint_dir=checkpoint_dir,
                     checkpoint_every=checkpoint_every, memory_check=memory.enabled(spark.conf.get), ring=ring,
                     **training, **held_out_and_saved, **basics)
        return _run_fit(frame, job, model, files, num_workers, staging, tracked)


def _over_ring(spec, communication, spark, allow_unencrypted, gpus_per_worker):
    """Whether a fit trains over tfbarrier's authenticated ring rather than MultiWorkerMirroredStrategy: a native
    Keras 3 model always; a tf_keras one with ``implementation`` "tfbarrier", or "auto" (the default) unless its
    workers have several GPUs each (local replicas) where traffic need not be encrypted."""
    implementation = (communication or {}).get("implementation", "auto")
    if getattr(spec, "native", False) or implementation == RING:
        return True
    encrypted = job_tls.required(spark) and not allow_unencrypted
    return implementation == "auto" and (encrypted or gpus_per_worker <= 1)


def _native_options(communication, class_weight_of_outputs):
    """Refuse what a Keras 3 model that trains natively cannot have yet."""
    native_model.check_options(
        **{"communication['implementation']": ((communication or {}).get("implementation", "auto") not in ("auto", RING),
                                                 "leave it out: the gradients travel over tfbarrier's ring"),
           "class_weight with a label per output": (class_weight_of_outputs, "give a sample_weight column instead")})


def _run_fit(frame, job, model, files, num_workers, staging, tracked):
    """Run the fit's stage (tracked in MLflow when ``tracked``) and make its FitResult."""
    submitted, spark = time.time(), frame.sparkSession
    params = tracking.fit_params(job, num_workers=num_workers, max_retries=staging["max_retries"],
                                 timeout=staging["timeout"], spark_master=cluster.master(spark)) if tracked else None
    with tracking.fit_run(tracked, params, model, job.batch_size) as run:
        results, attempts, events = stage.run(frame, job, num_workers, files, global_batch=job.batch_size,
                                              on_progress=run.on_progress, **staging)
        trained = job.model.trained_model(model, job.decode(results, files))
        result = FitResult.from_workers(trained, results, attempts, events, job.started_at, submitted, time.time())
        run.log_result(result)
    result.mlflow_run_id = run.run_id
    return result


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
    staging = _stage_arguments(verbose, timeout=timeout)
    try:
        function = pickle_user_code((train_fn, tuple(args), dict(kwargs or {})), train_fn)
    except Exception as exc:
        raise InvalidArgumentError(f"train_fn and its arguments cannot be pickled: {exc}") from exc
    spark = _spark_session(spark)
    basics, *_ = _job_basics(spark, env, use_gpu, num_workers, allow_unencrypted, started, tf_threads)
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
    staging = _stage_arguments(verbose, timeout=timeout)
    output_schema = checks.output_schema(columns)
    basics, *_ = _job_basics(data.sparkSession, env, use_gpu, num_workers, allow_unencrypted, started)
    frame = data if cluster.num_partitions(data) == num_workers else data.repartition(num_workers)
    with transfer.JobFiles() as files:
        job = ApplyJob(function=files.add_bytes("function.pkl", pickle_user_code(fn, fn)),
                       input_schema=to_arrow_schema(data.schema), output_schema=output_schema, **basics)
        results, _, _ = stage.run(frame, job, num_workers, files, **staging)
        return job.decode(results, files)
