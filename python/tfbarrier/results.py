"""What a job hands back: a training process's ``ProcessReport`` to its task, each task's
``WorkerResult`` to the driver, and ``FitResult``, what ``fit`` returns."""

import dataclasses

# Every key of a fit's ``timings``, in seconds: where it is measured, what it covers.
TIMINGS = {
    "prepare": "driver: from the call to submitting the stage (the checks, the data's profile included)",
    "stage_start": "driver: from submitting the stage to the chief's task starting (Spark's scheduling, any shuffle)",
    "environment": "task: building or finding the training process's Python environment (env=)",
    "data_shard": "task: streaming the partition to the shard, while the training process imports TensorFlow",
    "worker_start": "task: from starting the training process (or taking a spare) to its port",
    "files_fetched": "task: from its start until the job's files (the model's weights) arrived",
    "rendezvous": "task: the peers meeting",
    "tensorflow_import": "process: importing TensorFlow (0 for a spare, which had imported it)",
    "strategy_and_model": "process: the strategy, the model rebuilt in its scope, the datasets",
    "first_step": "process: from model.fit's call to the first step's end",
    "training": "process: model.fit",
    "checkpoints": "process: saving checkpoints (checkpoint_dir), within training",
    "trained_model_written": "process: writing the trained weights for the driver",
    "time_to_first_step": "driver: from the call to the chief's first step",
    "total": "driver: the whole call",
}


@dataclasses.dataclass
class ProcessReport:
    """What a training process reports to its task (protocol.RESULT_FILE), whatever the job's kind."""

    timings: dict  # seconds per phase in the process (TIMINGS)
    python_prefix: str  # the process's sys.prefix
    finished_at: float = None  # the process's clock when its work ended
    gpus: str = None  # CUDA_VISIBLE_DEVICES as the process read it, before importing TensorFlow
    output: object = dataclasses.field(default=None, repr=False)  # the kind's own report: FitOutput for fit
    files: dict = dataclasses.field(default_factory=dict)  # what it returns in files: {key: name in the work directory}


@dataclasses.dataclass
class FitOutput:
    """What every training process of a fit reports (``ProcessReport.output``); the chief's also carries
    the history, the early stop and the saved models."""

    steps: int = None  # steps this process ran
    checksum: str = None  # of the final weights: equal on every worker when replicas stayed in sync
    memory: dict = None  # resident memory in MB: tensorflow_mb, baseline_mb once set up, peak_mb
    first_step_at: float = None  # the process's clock at its first step (None if a resumed fit had none)
    initial_epoch: int = 0  # the epoch a resumed fit started from
    resumed_at: dict = None  # a resumed fit's first epoch and step (within it), and the steps run before it
    checkpoint_saves: int = None  # checkpoints this process took part in (checkpoint_dir)
    steps_per_execution: int = None  # training steps per call into TensorFlow
    communication: dict = None  # how its gradients travelled, as TensorFlow held it (communication.in_effect)
    history: dict = None  # the chief's: per-epoch metrics, as FitResult.history
    stopped_epoch: int = None  # the chief's: the last epoch run (from 0) when a callback stopped the training
    saved: list = dataclasses.field(default_factory=list)  # the chief's: save_to's {"epoch", "path"} per save

    CHIEF_ONLY = ("history", "stopped_epoch", "saved")

    def public(self):
        """This worker's fields of ``FitResult.workers``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.CHIEF_ONLY}


@dataclasses.dataclass
class WorkerResult:
    """One barrier task's result, built by the task and read by the driver: what the task did (its data,
    its rendezvous) and what its training process reported. ``public()`` is the part a user sees, in
    ``FitResult.workers``."""

    report: ProcessReport
    index: int = None
    host: str = None
    executor: str = None  # Spark's address of the executor
    port: int = None  # the training process's TensorFlow port
    rows: int = None  # rows of the task's shard
    written: dict = None  # what the job's write_input counted besides rows (fit: checksum, validation_rows...)
    agreed: dict = None  # what the peers agreed on (fit: steps_per_epoch, validation_steps)
    environment: dict = None  # path, built, seconds; None for the executor's own Python
    warm_start: bool = False  # the process was a spare that had imported TensorFlow already
    rendezvous_via: str = None  # how the peers met: "driver" (its link) or "allGather" (Spark's fallback)
    transfer: dict = None  # how the job's files came and the process's went: via, bytes and seconds each way
    task_started_at: float = None
    timings: dict = None  # the task's and its process's (TIMINGS)
    files: dict = None  # the reported files: {key: transfer.Payload}, on their way to the driver

    @property
    def output(self):
        return self.report.output

    def public(self):
        """The fields of ``FitResult.workers``: plain values R turns into a data.frame row."""
        written = dict(self.written or {})
        fields = {"index": self.index, "host": self.host, "executor": self.executor, "port": self.port,
                  "rows": self.rows, "shard_checksum": written.pop("checksum", None), **written,
                  "steps_per_epoch": (self.agreed or {}).get("steps_per_epoch"), "gpus": self.report.gpus,
                  "environment": self.environment, "python_prefix": self.report.python_prefix,
                  "warm_start": self.warm_start, "finished_at": self.report.finished_at, "transfer": self.transfer}
        kind = self.output.public() if hasattr(self.output, "public") else {}
        return {**fields, **kind, "timings": self.timings}


@dataclasses.dataclass
class FitResult:
    """What ``fit`` returns.

    Attributes
    ----------
    model : Keras model
        The trained Keras model, on the driver: the same Keras as the model passed in (tf_keras for a model
        function).
    history : dict
        Per-epoch metrics as Keras reports them, e.g. {"loss": [...], "accuracy": [...]}.
    timings : dict
        Seconds per phase: results.TIMINGS says what each key covers (the chief's process and task).
    workers : list of dict
        One dict per worker (WorkerResult.public): index, host, executor (Spark's address of it), port, rows,
        shard_checksum (of the rows it trained on), validation_rows and validation_checksum (with validation),
        steps_per_epoch, gpus (its CUDA_VISIBLE_DEVICES), environment (path, built, seconds; None for the
        executor's own Python), python_prefix (sys.prefix of its training process), warm_start (True when it
        trained in a spare process its executor kept, TensorFlow already imported), finished_at (its clock,
        time.time(), when training ended), transfer (how the job's files, the model's weights among them,
        reached it and the trained model left it: via "driver link" or "spark", fetched_bytes, fetch_seconds,
        sent_bytes, send_seconds, encryption: the link's TLS version and cipher, or "none"), then FitOutput's
        fields: steps, checksum (of the final weights: equal on every worker when the replicas stayed in sync),
        memory (its training process's resident memory in MB: tensorflow_mb once TensorFlow and the strategy
        were set up, baseline_mb once the model was too, peak_mb at the end), first_step_at, initial_epoch,
        resumed_at, checkpoint_saves (with checkpoint_dir: the saves it took part in), steps_per_execution and
        communication (what its training ran with); and its timings.
    attempts : list of dict
        One dict per submission of the barrier job: attempt, error (None for the one that succeeded),
        retryable; for the successful one initial_epoch (> 0 when it resumed), resumed_at (None, or the epoch
        and step it resumed at, and the steps run before it) and through_spark (the bytes Spark carried:
        job_bytes, the job in the tasks' closure, and result_bytes, their results; the model's files go outside
        Spark, see ``workers``).
    progress : list of dict
        The messages the workers streamed to the driver during the fit (kind, worker, sent_at, received_at,
        ...), as shown live at verbose=1 and 2.
    stopped_epoch : int or None
        The last epoch run (from 0) when a callback such as EarlyStopping stopped the fit; None when it ran
        every epoch.
    saved : list of dict
        With save_to, one dict per model the chief saved: epoch (from 1), path; with save_best one per
        improvement, all of the same best.keras, which holds the last (the best).
    mlflow_run_id : str or None
        With fit(mlflow=...), the id of the MLflow run the fit logged to; None without.
    """

    model: object
    history: dict
    timings: dict
    workers: list
    attempts: list = dataclasses.field(default_factory=list)
    progress: list = dataclasses.field(default_factory=list, repr=False)
    stopped_epoch: int = None  # the last epoch run (from 0) when a callback such as EarlyStopping stopped the fit
    saved: list = dataclasses.field(default_factory=list)
    mlflow_run_id: str = None

    def history_frame(self):
        """``history`` as a pandas DataFrame, one row per epoch (numbered from 1)."""
        import pandas as pd

        frame = pd.DataFrame(self.history)
        frame.index = pd.RangeIndex(1, len(frame) + 1, name="epoch")
        return frame

    def plot(self, path=None):
        """Training curves: one panel per metric, its validation twin (val_*) in the same panel.
        Saves a PNG to ``path`` when given; returns the matplotlib Figure (needs matplotlib)."""
        import matplotlib.pyplot as plt

        frame = self.history_frame()
        metrics = [m for m in frame.columns if not m.startswith("val_")]
        figure, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.2), squeeze=False)
        for axis, metric in zip(axes[0], metrics):
            axis.plot(frame.index, frame[metric], marker="o", label=metric)
            if f"val_{metric}" in frame:
                axis.plot(frame.index, frame[f"val_{metric}"], marker="o", label=f"val_{metric}")
                axis.legend()
            axis.set_title(metric)
            axis.set_xlabel("epoch")
        figure.tight_layout()
        if path is not None:
            figure.savefig(path)
        return figure

    def save(self, path):
        """Write the trained model to ``path``, a ``.keras`` archive (architecture, weights, compile
        settings) that the model's own Keras loads: ``keras.saving.load_model`` (Keras 3), or
        ``tf_keras.models.load_model`` for a model function's. Returns ``path``."""
        from tfbarrier.errors import InvalidArgumentError

        if not str(path).endswith(".keras"):
            raise InvalidArgumentError(f"save() writes a .keras archive, so the path must end in .keras, got {path!r}; "
                                       "export() writes a TensorFlow SavedModel directory")
        self.model.save(str(path))
        return path

    def export(self, path):
        """Write the trained model as a TensorFlow SavedModel directory for serving (TensorFlow
        Serving, ``tf.saved_model.load``): its ``serve`` signature maps a batch of inputs to the
        model's outputs. Returns ``path``."""
        import inspect

        quiet = {"verbose": False} if "verbose" in inspect.signature(self.model.export).parameters else {}
        self.model.export(str(path), **quiet)
        return path

    @property
    def num_workers(self):
        """How many workers trained."""
        return len(self.workers)

    @property
    def epochs(self):
        """How many epochs ran (fewer than asked for when a callback stopped the fit)."""
        return len(next(iter(self.history.values()), []))

    @classmethod
    def from_workers(cls, model, results, attempts, progress, started, submitted, finished):
        """The result of a fit that started at ``started`` (driver clock), submitted its stage at
        ``submitted`` and ended at ``finished``; ``results`` are the WorkerResults, chief first."""
        chief = results[0]
        timings = {"prepare": submitted - started, "stage_start": chief.task_started_at - submitted,
                   **chief.timings}
        if chief.output.first_step_at is not None:
            timings["time_to_first_step"] = chief.output.first_step_at - started
        timings["total"] = finished - started
        return cls(model=model, history=chief.output.history, timings=timings,
                   workers=[r.public() for r in results], attempts=attempts, progress=progress,
                   stopped_epoch=chief.output.stopped_epoch, saved=chief.output.saved)

    def __repr__(self):
        # the latest value of each metric: val_* is None in epochs that did not validate (validation_freq)
        latest = {k: next((x for x in reversed(v) if x is not None), None) for k, v in self.history.items()}
        last = ", ".join(f"{k}={v:.4g}" for k, v in latest.items() if v is not None)
        return (
            f"<FitResult: {self.num_workers} workers, {self.epochs} epochs, {last}; "
            f"{self.timings.get('total', float('nan')):.1f} s total>"
        )
