"""``fit``'s face: its signature and documentation, where each of its arguments is said; ``front.face`` binds a
call's arguments to them and hands them to its room, fitting/ (front.py; its gradients' exchange
tfbarrier.exchange). An argument that is a FitJob field is said once more there, with its check (fitting/job.py);
tests/python/test_fit_arguments.py holds the two together. ``run`` and ``apply`` have their faces in
functions/calls.py."""

from tfbarrier.fitting import front
from tfbarrier.results import FitResult
from tfbarrier.settings import STALL_TIMEOUT

__all__ = ["FitResult", "fit"]


@front.face
def fit(data, model, *, features, label=None, epochs=1, batch_size=32, num_workers=2, steps_per_epoch=None,
        seed=None, shuffle=True, shuffle_buffer=None, tf_threads=None, callbacks=None, checkpoint_dir=None,
        max_retries=0, timeout=None, stall_timeout=STALL_TIMEOUT, allow_unencrypted=False, use_gpu=False, verbose=1,
        tensorboard_dir=None, env=None, validation_data=None, validation_split=None, validation_freq=1,
        sample_weight=None, class_weight=None, save_to=None, save_best=None, save_mode="auto",
        steps_per_execution="auto", exchange="auto", communication=None, checkpoint_every=None, mlflow=None,
        **unknown):
    """Train a Keras model on a Spark DataFrame with ``num_workers`` Spark barrier tasks.

    Each task trains on its own partition of ``data`` in a TensorFlow process; gradients are averaged across
    workers every step, over tfbarrier's ring by default (``exchange``).

    Parameters
    ----------
    data : pyspark.sql.DataFrame
        The training data; it is never collected to the driver. fit() makes one validation pass
        over it (rows, nulls, array lengths) before training: cache() it if it is costly to compute.
        A plain Parquet scan of local files (``spark.read.parquet(path)``, columns selected at most)
        is instead read by the tasks themselves with pyarrow and checked from the files' footers:
        each task reads its Spark partition's files when the scan has ``num_workers`` partitions,
        else a contiguous, even share of the rows (docs/guides/data.md, "Parquet files").
    model : Keras model, callable or preset
        A compiled Keras model (Keras 3 or tf_keras), a function of no arguments that builds and compiles one
        in each training process (``keras`` or ``tf.keras``), or a KerasHub preset (``tfbarrier.preset``).
    features : str, list of str or dict
        One array column (e.g. a flat image, reshaped to the model's input shape), numeric columns, one
        binary column of encoded images (PNG, JPEG, GIF, BMP: ``spark.read.format("binaryFile")``'s
        ``content``), decoded and resized to the model's (height, width, channels) input as float32 in
        0-255, or one string column for a model that carries its preprocessor (docs/guides/data.md, "Text"). For a
        Keras 3 model of several inputs, {input name: column}: each a numeric column, an array column of
        numbers or a Spark ML vector; integers stay integers (int64).
    label : str or dict
        A numeric column, or an array column (a value per position); {output name: column} for several
        outputs. None only for text whose preprocessor makes the labels (a causal LM).
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
        Give each training process the GPUs Spark assigned to its task (docs/guides/clusters.md, "GPUs").
    verbose : int
        0 silent; 1 a live progress bar and a line per epoch; 2 also every worker's events and output lines.
    tensorboard_dir : str, optional
        The chief writes TensorBoard logs there.
    env : PythonEnv, optional
        The training processes' Python environment (docs/guides/clusters.md, "Python on the executors");
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
        (``keras.saving.load_model``; a model function's in the Keras it built), ``epoch-001.keras`` and so on,
        with ``saved.json`` listing them and each epoch's metrics: a long fit leaves usable models even
        if the driver dies. ``FitResult.saved`` lists them. A preset's are ``from_preset`` directories.
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
    exchange : str
        How the gradients travel between the workers (tfbarrier.exchange): "tfbarrier", tfbarrier's own ring,
        which admits only the job's processes and is TLS where the cluster encrypts; "strategy",
        MultiWorkerMirroredStrategy's collectives through TensorFlow's gRPC server, which accepts any client
        and is never encrypted (a trusted network only; workers of several GPUs each); "auto" (default):
        the ring, or the strategy for workers of several GPUs each where traffic need not be encrypted.
    communication : dict, optional
        The exchange's options: ``bytes_per_pack`` (gradients travel in packs of about this size; 0: one of
        every gradient), ``compression`` "fp16" (the gradients summed in float16: half the bytes, about three
        significant digits, float16's range) or "none" (default), ``timeout_seconds``; the strategy's
        ``implementation`` too ("auto", "ring" or "nccl": its CommunicationImplementation); the ring's ``shard``
        "optimizer" (each worker holds the optimizer's state of its own share of the weights, about 1/N of the
        slots: a step reduce-scatters the gradients and all-gathers the updated weights, the bytes of an
        all-reduce) or "none" (default). Default: packs of 16 MB, no compression, no shard. ``FitResult.workers`` reports what each worker's gradients took. Before
        ``exchange=``, ``{"implementation": "tfbarrier"}`` asked for the ring and ``"ring"`` / ``"nccl"`` alone
        for the strategy: those still work, with a FutureWarning, until the next release.
    mlflow : bool, str or mlflow.ActiveRun, optional
        Log the fit to MLflow (``pip install tfbarrier[mlflow]``), from the driver: True logs to the active
        run, else to a new run in the current experiment; a string names the experiment of a new run (a
        run id continues that run, as an ``mlflow.ActiveRun`` does). The run gets the arguments that shaped
        the training, the model's size and optimizer, a metric point per epoch as the epochs end (step =
        the epoch, from 1: ``loss``, ``val_*``, ``samples_per_second``), the timings, workers and retries,
        the trained model as an MLflow model (docs/guides/tracking.md) and ``plot()``'s figure. A run
        the fit started ends FINISHED, or FAILED with the error. ``FitResult.mlflow_run_id`` is its id.
        MLflow's tracking URI is its own (``MLFLOW_TRACKING_URI``, ``mlflow.set_tracking_uri``). Default: off.

    Returns
    -------
    FitResult
    """
