"""The fit kind's driver side: fit's arguments (bound to api.fit's signature by ``face``) checked and made into
its job and the DataFrame of its barrier stage (``prepare``: no Spark job but the data's profile), then the stage
run and its FitResult made (``train``)."""

import dataclasses
import functools
import inspect
import random
import time

from tfbarrier import checks, settings, tracking
from tfbarrier import exchange as exchanges
from tfbarrier.data import parquet_source, profiles, text
from tfbarrier.data.layouts import layout as features_layout
from tfbarrier.errors import ReplicasDivergedError
from tfbarrier.fitting.job import VALIDATION_COLUMN, FitJob, validates
from tfbarrier.models import memory, native_model, presets
from tfbarrier.results import FitResult
from tfbarrier.spark import cluster, gpus, preflight, stage, transfer

PARTITION_KEY = "__tfbarrier_partition"  # with validation_data: the key that sends each row to its worker
# Data sources the tasks read themselves, tried in order: each plan(frame, partitions, layout, num_workers)
# returns None, or a source with a ``profile`` (profiles.check_profile's) and ``batches(index, columns)``.
DIRECT_SOURCES = (parquet_source.plan,)


def face(signature):
    """fit itself, from ``signature`` (api.fit: its parameters and their documentation, said once there; its body
    never runs): each call's arguments bound to those parameters, defaults filled in, and handed to ``call``."""
    parameters = inspect.signature(signature)

    @functools.wraps(signature)
    def fit(*args, **kwargs):
        bound = parameters.bind(*args, **kwargs)
        bound.apply_defaults()
        return call(dict(bound.arguments), signature)

    return fit


def call(arguments, signature):
    """One fit: ``arguments`` as api.fit's ``signature`` names them, checked, its stage run: the FitResult."""
    started = time.time()
    checks.no_unknown_arguments("fit", arguments.pop("unknown"), signature)
    tracked = tracking.resolve(arguments.pop("mlflow"))
    staging = preflight.stage_arguments(arguments.pop("verbose"), arguments.pop("max_retries"), arguments.pop("timeout"))
    with transfer.JobFiles() as files:
        frame, job = prepare(files, started, arguments)
        num_workers = checks.positive_int("num_workers", arguments["num_workers"])
        return train(frame, job, arguments["model"], files, num_workers, staging, tracked)


def prepare(files, started, arguments):
    """(the DataFrame of the fit's barrier stage, its FitJob), from fit's ``arguments`` (by name), its files going
    to ``files`` (transfer.JobFiles). Everything is checked here, before any Spark job but the data's profile: each
    argument that is a FitJob field as its field says (fitting/job.argument), the others below."""
    a = arguments
    data = checks.spark_dataframe(a["data"])
    model, num_workers = a["model"], checks.positive_int("num_workers", a["num_workers"])
    requested, communication = exchanges.requested(a["exchange"], exchanges.check_communication(a["communication"]))
    fields = {field.name: field.metadata["check"](field.name, a[field.name])
              for field in dataclasses.fields(FitJob) if field.metadata.get("check")}
    fields.update(communication=communication,  # the same on every attempt:
                  data_seed=random.randrange(2**31) if fields["seed"] is None else fields["seed"])
    layout = features_layout(data.schema, a["features"], a["label"], weight=a["sample_weight"])
    validation_data, held_out_and_saved = _validation_and_saving(
        a["validation_data"], a["validation_split"], a["validation_freq"], a["features"], a["label"],
        a["sample_weight"], a["save_to"], a["save_best"], a["save_mode"])
    spark = data.sparkSession
    class_weight = fields["class_weight"]
    if layout.takes_text:
        if presets.is_preset(model):  # its preprocessor is loaded with it, where it trains
            presets.check_reads_text(model, layout.features[0])
        else:
            text.check_model(model, layout.features[0], native_model.keras_flavor(model) == "keras3")
        native_model.check_options(**{"class_weight without a label": (
            class_weight if layout.label is None else None, "weigh the rows through the preprocessor's labels")})
    spec = native_model.spec_for_fit(model, files, spark.conf.get(settings.KERAS3_TRAINING_CONF, "auto"),
                                     named=layout.named or layout.takes_text)
    native = getattr(spec, "native", False)
    if native:
        native_model.check_options(**{"class_weight with a label per output": (
            class_weight if layout.outputs else None, "give a sample_weight column instead")})
    encrypted = preflight.encryption_required(spark) and not a["allow_unencrypted"]

    def exchange_for(gpus_per_worker):  # chosen once, when the GPUs per worker are known
        return exchanges.choose(requested, communication, native=native, encrypted=encrypted,
                                gpus_per_worker=gpus_per_worker)

    callbacks = checks.callbacks_function(a["callbacks"])
    checkpoint_dir = checks.directory("checkpoint_dir", a["checkpoint_dir"])
    checkpoint_every = checks.checkpoint_every(a["checkpoint_every"], checkpoint_dir)
    basics, chosen, gpus_per_worker = preflight.job_basics(spark, a["env"], a["use_gpu"], num_workers,
                                                           a["allow_unencrypted"], started, a["tf_threads"], exchange_for)
    gpus.check_batch(fields["batch_size"], num_workers, gpus_per_worker)
    rows = fields["batch_size"] // num_workers
    sharded = (communication or {}).get("shard", "none") != "none"
    memory.check_on_driver(spark, spec.size, rows, num_workers, chosen, sharded)  # as far as the model alone tells
    frame, source, profile = _training_frame(data, layout, num_workers, spec.input_shape, validation_data)
    widths = text.sequence_widths(model) if layout.takes_text else layout.widths(profile)
    _check_memory_of_sequences(spark, spec, model, widths, rows, num_workers, chosen, sharded)
    job = FitJob(model=spec, layout=layout, source=source,
                 callbacks=callbacks and files.add_bytes("callbacks.pkl", callbacks), checkpoint_dir=checkpoint_dir,
                 checkpoint_every=checkpoint_every, memory_check=memory.enabled(spark.conf.get), exchange=chosen,
                 **{**fields, **held_out_and_saved, **basics})
    return frame, job


def check_replicas(results):
    """Refuse a fit whose workers ended with different weights (their checksums differ): every worker must
    hold the one trained model, or none is it."""
    checksums = [result.output.checksum for result in results]
    if len(set(checksums)) > 1:
        apart = ", ".join(f"worker {i}: {checksum}" for i, checksum in enumerate(checksums))
        raise ReplicasDivergedError(
            f"the workers ended with different weights ({apart}), so no one model is the trained one: every "
            "weight must be updated through model.optimizer (a custom train_step that updates some other way, "
            "or a callback that changes one worker's weights, makes the replicas drift apart)", checksums)


def train(frame, job, model, files, num_workers, staging, tracked):
    """Run the fit's stage (tracked in MLflow when ``tracked``) and make its FitResult."""
    submitted, spark = time.time(), frame.sparkSession
    params = tracking.fit_params(job, num_workers=num_workers, max_retries=staging["max_retries"],
                                 timeout=staging["timeout"], spark_master=cluster.master(spark)) if tracked else None
    with tracking.fit_run(tracked, params, model, job.batch_size) as run:
        results, attempts, events = stage.run(frame, job, num_workers, files, global_batch=job.batch_size,
                                              on_progress=run.on_progress, **staging)
        check_replicas(results)
        trained = job.model.trained_model(model, job.decode(results, files))
        result = FitResult.from_workers(trained, results, attempts, events, job.started_at, submitted, time.time())
        run.log_result(result)
    result.mlflow_run_id = run.run_id
    return result


def _validation_and_saving(validation_data, validation_split, validation_freq, features, label, sample_weight,
                           save_to, save_best, save_mode):
    """(validation_data checked, fit's validation and saving arguments checked, as FitJob fields)."""
    validation_data, validation_split, validation_freq = profiles.validation_arguments(
        validation_data, validation_split, validation_freq, features, label, sample_weight)
    save_to, save_best, save_mode = checks.save_arguments(
        save_to, save_best, save_mode, validates(validation_data is not None, validation_split))
    return validation_data, {"has_validation_column": validation_data is not None,
                             "validation_split": validation_split, "validation_freq": validation_freq,
                             "save_to": save_to, "save_best": save_best, "save_mode": save_mode}

def _check_memory_of_sequences(spark, spec, model, widths, rows, num_workers, exchange, sharded):
    """Check again, what a step keeps traced, a model whose layers hide their sizes until the data's ``widths``
    tell them (a sequence's length): ``spec.size`` then carries the traced sizes to the training processes."""
    sized = spec.size and spec.size.with_widths(model, memory.input_shapes(model, widths))
    if sized is not spec.size:
        spec.size = sized
        memory.check_on_driver(spark, sized, rows, num_workers, exchange, sharded)


def _training_frame(data, layout, num_workers, input_shape, validation_data=None):
    """(the DataFrame of the barrier stage, the direct source its tasks read (DIRECT_SOURCES) or None, the
    data's profile), once the data passed the checks. A plain Parquet scan is read by the tasks themselves and profiled from
    its footers (see parquet_source for which); any other DataFrame is profiled with one aggregate
    pass and streamed by Spark, repartitioned unless it has ``num_workers`` partitions, none of them
    empty. ``validation_data``, profiled too, joins the training rows marked by VALIDATION_COLUMN, in one
    shuffle (_with_validation_rows)."""
    frame = data.select(*layout.projection(data.sparkSession))
    partitions = cluster.num_partitions(frame)
    source = None if validation_data is not None else _direct_source(frame, partitions, layout, num_workers)
    profile = source.profile if source else profiles.profile(frame, layout)
    profiles.check_profile(profile, layout, num_workers, input_shape)
    if source:
        return data.sparkSession.range(0, num_workers, numPartitions=num_workers), source, profile
    keep = partitions == num_workers and profile["nonempty_partitions"] == num_workers
    if validation_data is not None:
        return _with_validation_rows(frame, keep, validation_data, layout, num_workers, input_shape), None, profile
    return (frame if keep else frame.repartition(num_workers)), None, profile

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
    profiles.check_profile(profiles.profile(held, layout), layout, 1, input_shape, what="validation_data")
    keys = cluster.partition_keys(frame.sparkSession, num_workers)
    placed = [cluster.with_partition_key(part, PARTITION_KEY, keys, kept).withColumn(VALIDATION_COLUMN, F.lit(flag))
              for part, kept, flag in ((frame, keep, False),
                                       (held, cluster.num_partitions(held) == num_workers, True))]
    return placed[0].unionByName(placed[1]).repartition(num_workers, PARTITION_KEY).drop(PARTITION_KEY)
