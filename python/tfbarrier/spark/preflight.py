"""What every call asks of the cluster before its barrier stage, on the driver: the session, the executors'
Python environment (an archive is shipped), the GPU plan, the job's encryption, the executors' Python and
free slots for every worker; and the stage's own arguments. Each refuses in words before any Spark job."""

from tfbarrier import checks, settings
from tfbarrier.errors import ClusterError, InvalidArgumentError
from tfbarrier.spark import cluster, gpus
from tfbarrier.tls import Credentials
from tfbarrier.spark.environment import PythonEnv


def spark_session(spark):
    """``spark``, else the active SparkSession."""
    from pyspark.sql import SparkSession

    spark = spark or SparkSession.getActiveSession()
    if spark is None:
        raise InvalidArgumentError("no active SparkSession: start one first or pass spark=")
    return spark


def python_env(spark, env):
    """Check ``env`` and ship an archive environment to the executors."""
    if env is None:
        return None
    if not isinstance(env, PythonEnv):
        raise InvalidArgumentError(f"env must be a tfbarrier.PythonEnv or None, got {type(env).__name__}")
    if env.archive:
        cluster.add_archive(spark, env.archive)
    return env


def job_basics(spark, env, use_gpu, num_workers, allow_unencrypted, started, tf_threads=None, exchange_for=None):
    """The Job fields every kind shares, once the cluster can run the job: its Python environment, the GPU
    plan, its TLS credentials (a job whose workers talk through TensorFlow's server is refused where traffic
    must be encrypted, unless allowed: every run and apply, and a fit whose exchange ``exchange_for(GPUs per
    worker)`` runs that server), the executors' Python and ``num_workers`` free slots. Returns (those fields,
    the fit's exchange or None, the GPUs each worker has)."""
    tf_threads = checks.positive_int("tf_threads", tf_threads, allow_none=True)
    env = python_env(spark, env)
    gpu_plan, gpus_per_worker = gpus.plan(spark, use_gpu, num_workers)
    exchange = exchange_for(gpus_per_worker) if exchange_for else None
    credentials = job_credentials(spark, allow_unencrypted, tensorflow_server=exchange is None or exchange.tensorflow_server)
    cluster.check_executor_python(spark)
    cluster.check_barrier_capacity(spark, num_workers)
    basics = {"env": env, "gpus": gpu_plan, "spare_idle_timeout": cluster.spare_idle_timeout(spark),
              "started_at": started, "tf_threads": tf_threads, "tls": credentials}
    return basics, exchange, gpus_per_worker


def stage_arguments(verbose, max_retries=0, timeout=None):
    """stage.run's arguments of a call, checked."""
    return {"verbose": checks.verbosity(verbose), "max_retries": checks.non_negative_int("max_retries", max_retries),
            "timeout": checks.positive_seconds("timeout", timeout)}


def encryption_reasons(spark):
    """Why a job's own traffic must be encrypted: the settings of ENCRYPTION_CONFS that are on (Spark
    encrypts its own), and spark.tfbarrier.encrypt=always; empty when it need not be."""
    setting = str(spark.conf.get(settings.ENCRYPT_CONF, "auto")).strip().lower()
    if setting not in ("auto", "always"):
        raise ClusterError(f"{settings.ENCRYPT_CONF} must be 'auto' (encrypt when Spark does) or 'always', "
                           f"got {setting!r}")
    return cluster.encryption_enabled(spark) + ([f"{settings.ENCRYPT_CONF}=always"] if setting == "always" else [])


def encryption_required(spark):
    """Whether a job's own traffic must be encrypted (``encryption_reasons``)."""
    return bool(encryption_reasons(spark))


def job_credentials(spark, allow_unencrypted, tensorflow_server):
    """The tls.Credentials a job's own traffic is encrypted with, or None when it need not be
    (``encryption_reasons``). Refuses a job whose workers talk over TensorFlow's gRPC (``tensorflow_server``),
    which nothing here encrypts, where traffic must be encrypted, unless the user accepted that with
    ``allow_unencrypted``."""
    why = encryption_reasons(spark)
    if why and tensorflow_server and not allow_unencrypted:
        raise ClusterError(
            f"{' and '.join(why)} is on, but TensorFlow's gRPC traffic between the workers (gradients, weights) "
            "is not encrypted: this job uses it (a fit with exchange='strategy': MultiWorkerMirroredStrategy; run() "
            "and apply(): they hand the workers a TF_CONFIG for it). Leave a fit's exchange at 'auto' or "
            "'tfbarrier' (tfbarrier's own encrypted ring), or run on a trusted network and pass "
            "allow_unencrypted=True to accept that")
    return Credentials.new() if why else None
