"""Which GPUs each training process sees: the ones Spark's resource scheduler gave its task.

Decided on the driver (``plan``) and applied in the task (``visible_devices``), always through
``CUDA_VISIBLE_DEVICES`` in the training process's environment from its start, before it imports
TensorFlow (a spare serves only a task with the same GPUs):
- ``use_gpu=False``: no GPU (an empty ``CUDA_VISIBLE_DEVICES``);
- ``use_gpu=True`` on a cluster: the task's ``TaskContext.resources()["gpu"]`` addresses, which the
  strategy uses as local replicas when there are several;
- ``use_gpu=True`` in local mode: the driver's GPUs (``spark.driver.resource.gpu.*``), split evenly
  among the tasks.
Spark's addresses index into an executor's own ``CUDA_VISIBLE_DEVICES`` when that is already set
(as pyspark's TorchDistributor does).
"""

import re

from tfbarrier.errors import ClusterError, InvalidArgumentError
from tfbarrier.settings import GPUS_ENV
from tfbarrier.spark import cluster

HIDE = "hide"
TASK = "task"
_CUDA_INDEX = re.compile(r"^(0|[1-9][0-9]*)$")
CLUSTER_SETTINGS = (
    "spark.executor.resource.gpu.amount, spark.executor.resource.gpu.discoveryScript and "
    "spark.task.resource.gpu.amount"
)
LOCAL_SETTINGS = "spark.driver.resource.gpu.amount and spark.driver.resource.gpu.discoveryScript"


def plan(spark, use_gpu, num_workers):
    """HIDE, TASK, or (local mode) one list of GPU addresses per worker; and GPUs per worker."""
    if not use_gpu:
        return HIDE, 0
    if cluster.is_local_mode(spark):
        resource = cluster.driver_resources(spark).get("gpu")
        addresses = list(resource.addresses) if resource else []
        # The driver's resource lists every address discovered, not only the amount asked for.
        addresses = addresses[: int(float(spark.conf.get("spark.driver.resource.gpu.amount", "0") or 0))]
        if len(addresses) < num_workers:
            raise ClusterError(
                f"use_gpu=True in local mode splits the driver's GPUs among the {num_workers} workers, but "
                f"the driver has {len(addresses)}: set {LOCAL_SETTINGS} when starting the session, "
                "or use_gpu=False"
            )
        per_worker = len(addresses) // num_workers
        return [addresses[i * per_worker:(i + 1) * per_worker] for i in range(num_workers)], per_worker
    per_task = float(spark.conf.get("spark.task.resource.gpu.amount", "0") or 0)
    if per_task < 1:
        raise ClusterError(
            "use_gpu=True needs GPUs scheduled to each Spark task, and spark.task.resource.gpu.amount is "
            f"{per_task:g}: start the session with {CLUSTER_SETTINGS} (e.g. 1 GPU per task), or use_gpu=False"
        )
    return TASK, int(per_task)


def check_batch(batch_size, num_workers, gpus_per_worker):
    """Refuse a global batch that the replicas cannot split evenly (whether a worker may have several GPUs
    is its exchange's to say: tfbarrier.exchange)."""
    replicas = num_workers * max(1, gpus_per_worker)
    if batch_size % replicas:
        raise InvalidArgumentError(
            f"batch_size={batch_size} is split evenly across {replicas} replicas ({num_workers} workers x "
            f"{gpus_per_worker} GPUs): use a multiple of {replicas}"
        )


def visible_devices(gpus, context, index, environ):
    """The CUDA_VISIBLE_DEVICES value for worker ``index``'s training process."""
    if gpus == HIDE:
        return ""
    if gpus == TASK:
        resource = context.resources().get("gpu")
        addresses = list(resource.addresses) if resource else []
    else:
        addresses = list(gpus[index])
    if not all(_CUDA_INDEX.match(a) for a in addresses):
        raise ClusterError(
            f"GPU addresses {addresses} are not CUDA device indexes (0, 1, ...): fix the discovery script"
        )
    inherited = environ.get(GPUS_ENV)
    if inherited:
        devices = inherited.split(",")
        addresses = [devices[int(a)] for a in addresses]
    return ",".join(addresses)
