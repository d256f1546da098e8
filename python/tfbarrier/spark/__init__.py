"""Spark's side of every job: what is asked of the cluster (cluster.py), the barrier stage and its tasks
(stage.py, task.py), the training processes they start or take as spares (launcher.py, spares.py,
training_process.py) and what connects them (protocol.py, rendezvous.py, driver_link.py, transfer.py),
the kinds of job every call shares (job.py), the executors' Python environments, GPUs and directories,
and attaching to a Spark driver JVM another program runs (attachment.py). Standard library and pyspark
only: TensorFlow lives in the training processes."""
