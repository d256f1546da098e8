"""tfbarrier.ml: a Keras model as a pyspark.ml Estimator, for Pipelines, CrossValidator and
TrainValidationSplit.

    estimator = KerasEstimator(model=model, featuresCol="features", labelCol="label", epochs=3, numWorkers=2)
    pipeline = Pipeline(stages=[VectorAssembler(...), StandardScaler(...), estimator]).fit(df)

``KerasEstimator.fit`` is ``tfbarrier.fit`` and ``KerasModel.transform`` is ``tfbarrier.predict`` (lazy,
on the executors). ``fitMultiple``, what CrossValidator and TrainValidationSplit call with a param grid,
trains the grid's models at once, as many as the cluster has task slots for (as ``tune`` does).
A KerasModel saves its Keras model as a ``.keras`` archive next to Spark ML's metadata, so a
PipelineModel that holds one saves and loads as any other.
"""

import concurrent.futures
import json
import os
import shutil
import tempfile
import threading
import urllib.parse

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasPredictionCol, HasSeed, HasWeightCol
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from tfbarrier.api import fit as tfbarrier_fit
from tfbarrier.errors import InvalidArgumentError
from tfbarrier.predicting.inference import predict as tfbarrier_predict
from tfbarrier.models.model_spec import keras_flavor, keras_module
from tfbarrier.spark import cluster

__all__ = ["KerasEstimator", "KerasModel"]

ARCHIVE = "model.keras"  # the Keras model, beside Spark ML's metadata in a saved KerasModel's directory
HISTORY = "history.json"  # its training history


def _names(value):
    """A Param's {model input or output name: column}, or None."""
    if value is not None and not (isinstance(value, dict) and value
                                  and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
        raise TypeError(f"expected a dict of model input or output names to column names, got {value!r}")
    return None if value is None else dict(value)


class _ScoringParams(HasFeaturesCol, HasPredictionCol):
    output = Param(Params._dummy(), "output", "what the prediction column holds: 'class' (the class id, a double "
                   "as in Spark ML's classifiers), "
                   "'probabilities' or 'raw' (array<float>), as tfbarrier.predict's output",
                   typeConverter=TypeConverters.toString)
    predictBatchSize = Param(Params._dummy(), "predictBatchSize", "rows per forward pass when transforming",
                             typeConverter=TypeConverters.toInt)
    featuresCols = Param(Params._dummy(), "featuresCols", "{model input name: column}, one column per input of a "
                         "Keras 3 model of several inputs (then featuresCol is not used)", typeConverter=_names)

    def __init__(self):
        super().__init__()
        self._setDefault(featuresCol="features", predictionCol="prediction", output="class", predictBatchSize=1024)

    def _features(self):
        """tfbarrier's features=: featuresCols when set, else featuresCol."""
        named = self.getOrDefault(self.featuresCols) if self.isSet(self.featuresCols) else None
        return named or self.getFeaturesCol()


class KerasEstimator(Estimator, _ScoringParams, HasLabelCol, HasSeed, HasWeightCol):
    """A compiled Keras model (or a function of no arguments that builds and compiles one with tf.keras)
    trained with tfbarrier.fit across ``numWorkers`` Spark barrier tasks; ``fit`` returns a KerasModel."""

    model = Param(Params._dummy(), "model", "a compiled Keras model (Keras 3 or tf_keras), or a function of no "
                  "arguments that builds and compiles one with tf.keras (for custom layers)")
    epochs = Param(Params._dummy(), "epochs", "passes over the data", typeConverter=TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "the global batch size, split evenly across the workers",
                      typeConverter=TypeConverters.toInt)
    numWorkers = Param(Params._dummy(), "numWorkers", "Spark barrier tasks, one TensorFlow worker each",
                       typeConverter=TypeConverters.toInt)
    stepsPerEpoch = Param(Params._dummy(), "stepsPerEpoch", "steps per epoch (default: one pass over the rows)",
                          typeConverter=TypeConverters.toInt)
    validationSplit = Param(Params._dummy(), "validationSplit", "the fraction of each partition held out to "
                            "validate on after each epoch (val_* in the history)", typeConverter=TypeConverters.toFloat)
    shuffle = Param(Params._dummy(), "shuffle", "shuffle each worker's rows every epoch",
                    typeConverter=TypeConverters.toBoolean)
    verbose = Param(Params._dummy(), "verbose", "0 silent, 1 a progress bar, 2 also the workers' lines",
                    typeConverter=TypeConverters.toInt)
    labelCols = Param(Params._dummy(), "labelCols", "{model output name: column}, one label column per output of a "
                      "Keras 3 model of several outputs (then labelCol is not used)", typeConverter=_names)
    fitArgs = Param(Params._dummy(), "fitArgs", "a dict of further tfbarrier.fit arguments (callbacks, "
                    "checkpoint_dir, class_weight, communication...)")

    @keyword_only
    def __init__(self, *, model=None, featuresCol="features", labelCol="label", predictionCol="prediction",
                 output="class", predictBatchSize=1024, epochs=1, batchSize=32, numWorkers=2, stepsPerEpoch=None,
                 validationSplit=None, shuffle=True, seed=None, weightCol=None, verbose=1, fitArgs=None,
                 featuresCols=None, labelCols=None):
        super().__init__()
        self._setDefault(labelCol="label", epochs=1, batchSize=32, numWorkers=2, shuffle=True, verbose=1)
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, model=None, featuresCol="features", labelCol="label", predictionCol="prediction",
                  output="class", predictBatchSize=1024, epochs=1, batchSize=32, numWorkers=2, stepsPerEpoch=None,
                  validationSplit=None, shuffle=True, seed=None, weightCol=None, verbose=1, fitArgs=None,
                  featuresCols=None, labelCols=None):
        """Set the params given by name (pyspark.ml's keyword-only convention)."""
        return self._set(**self._input_kwargs)

    def _fit_arguments(self):
        """tfbarrier.fit's keyword arguments from the params."""
        if not self.isDefined(self.model):
            raise InvalidArgumentError("KerasEstimator needs model=: a compiled Keras model, or a function that "
                                       "builds one")
        optional = {"steps_per_epoch": self.stepsPerEpoch, "validation_split": self.validationSplit,
                    "seed": self.seed, "sample_weight": self.weightCol}
        arguments = dict(self.getOrDefault(self.fitArgs) if self.isDefined(self.fitArgs) else {})
        arguments.update({name: self.getOrDefault(param) for name, param in optional.items() if self.isSet(param)})
        labels = self.getOrDefault(self.labelCols) if self.isSet(self.labelCols) else None
        arguments.update(features=self._features(), label=labels or self.getLabelCol(),
                         epochs=self.getOrDefault(self.epochs), batch_size=self.getOrDefault(self.batchSize),
                         num_workers=self.getOrDefault(self.numWorkers), shuffle=self.getOrDefault(self.shuffle),
                         verbose=self.getOrDefault(self.verbose))
        return arguments

    def _fit(self, dataset):
        arguments = self._fit_arguments()  # refuses a missing model first
        result = tfbarrier_fit(dataset, self.getOrDefault(self.model), **arguments)
        return self._copyValues(KerasModel(result.model, history=result.history, workers=result.workers))

    def fitMultiple(self, dataset, paramMaps):
        """Fit one model per param map, as many at once as the cluster has task slots for (slots //
        numWorkers); an iterator of (index, KerasModel) in the order they finish, safe to call from
        several threads (what CrossValidator and TrainValidationSplit expect)."""
        estimators = [self.copy(params) for params in paramMaps]
        workers = max(estimator.getOrDefault(estimator.numWorkers) for estimator in estimators) if estimators else 1
        return _Finished(dataset, estimators, cluster.fits_at_once(dataset.sparkSession, workers, len(estimators)))


class _Finished:
    """The models of ``estimators``, fitted ``concurrency`` at a time, yielded as (index, model) as they finish."""

    def __init__(self, dataset, estimators, concurrency):
        self._pool = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="tfbarrier-fit")
        self._index_of = {self._pool.submit(estimator.fit, dataset): index
                          for index, estimator in enumerate(estimators)}
        self._finished = concurrent.futures.as_completed(self._index_of)
        self._lock = threading.Lock()  # CrossValidator's threads share the iterator
        self._left = len(self._index_of)

    def __iter__(self):
        return self

    def __next__(self):
        with self._lock:
            if not self._left:
                raise StopIteration
            future = next(self._finished)
            self._left -= 1
            if not self._left:
                self._pool.shutdown(wait=False)
        return self._index_of[future], future.result()


class KerasModel(Model, _ScoringParams, MLWritable, MLReadable):
    """A trained Keras model as a pyspark.ml Model: ``transform`` is tfbarrier.predict.

    keras_model: the trained Keras model; history: per-epoch metrics; workers: what each worker reported
    (tfbarrier.FitResult's)."""

    def __init__(self, keras_model=None, history=None, workers=None):
        super().__init__()
        self.keras_model, self.history, self.workers = keras_model, history or {}, workers or []

    def _transform(self, dataset):
        output, column = self.getOrDefault(self.output), self.getPredictionCol()
        scored = tfbarrier_predict(dataset, self.keras_model, features=self._features(), output_col=column,
                                   output=output, batch_size=self.getOrDefault(self.predictBatchSize))
        if output != "class":
            return scored
        # Spark ML's classifiers and evaluators take a class id as a double (a column per output of several)
        return scored.withColumns({name: scored[name].cast("double") for name in scored.columns
                                   if name not in dataset.columns})

    def write(self):
        return _KerasModelWriter(self)

    @classmethod
    def read(cls):
        return _KerasModelReader()


class _KerasModelWriter(MLWriter):
    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path):
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession,
                                         extraMetadata={"keras": keras_flavor(self.instance.keras_model)})
        with tempfile.TemporaryDirectory(prefix="tfbarrier-ml-") as local:
            self.instance.keras_model.save(os.path.join(local, ARCHIVE))
            with open(os.path.join(local, HISTORY), "w") as f:
                json.dump(self.instance.history, f)
            for name in (ARCHIVE, HISTORY):
                _copy(self.sparkSession, os.path.join(local, name), _join(path, name), upload=True)


class _KerasModelReader(MLReader):
    def load(self, path):
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        with tempfile.TemporaryDirectory(prefix="tfbarrier-ml-") as local:
            for name in (ARCHIVE, HISTORY):
                _copy(self.sparkSession, _join(path, name), os.path.join(local, name), upload=False)
            with open(os.path.join(local, HISTORY)) as f:
                history = json.load(f)
            keras = keras_module(metadata["keras"])
            model = KerasModel(keras.models.load_model(os.path.join(local, ARCHIVE)), history=history)
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        return model


def _join(path, name):
    return path.rstrip("/") + "/" + name


def _is_local(path):
    return urllib.parse.urlparse(path).scheme in ("", "file")


def _copy(spark, source, target, upload):
    """Copy a file between this machine and ``path``'s file system: the local one directly, any other
    (HDFS, S3...) through Hadoop's FileSystem in Spark's JVM."""
    remote = target if upload else source
    if _is_local(remote):
        local_remote = urllib.parse.urlparse(remote).path if remote.startswith("file:") else remote
        if upload:
            os.makedirs(os.path.dirname(local_remote), exist_ok=True)
            shutil.copyfile(source, local_remote)
        else:
            shutil.copyfile(local_remote, target)
        return
    if cluster.is_connect(spark):
        raise InvalidArgumentError(f"under Spark Connect a KerasModel saves to and loads from local paths only, "
                                   f"not {remote!r}: save it to a local directory and copy that")
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(remote)
    file_system = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if upload:
        file_system.copyFromLocalFile(False, True, jvm.org.apache.hadoop.fs.Path(source), hadoop_path)
    else:
        file_system.copyToLocalFile(False, hadoop_path, jvm.org.apache.hadoop.fs.Path(target), True)
