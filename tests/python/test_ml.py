"""tfbarrier.ml: KerasEstimator and KerasModel in pyspark.ml Pipelines, CrossValidator, and saved pipelines."""

import numpy as np
import pandas as pd
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.functions import vector_to_array
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit
from conftest import meet_in_pairs
from spark_ml_pipeline import PIXELS, featurizer, mlp

from tfbarrier.errors import InvalidArgumentError
from tfbarrier.predicting.inference import predict_local
from tfbarrier.ml import KerasEstimator, KerasModel



def accuracy():
    return MulticlassClassificationEvaluator(labelCol="digit", metricName="accuracy")  # needs the SparkContext


@pytest.fixture(scope="module")
def pixel_columns(spark, digits):
    """(train, held out): the digits with each pixel in a column of its own, as Spark ML pipelines start."""
    return tuple(spark.createDataFrame(pd.DataFrame(np.stack(frame["pixels"]), columns=PIXELS)
                                       .assign(digit=frame["digit"])).cache() for frame in digits)


@pytest.fixture(scope="module")
def pipeline_model(pixel_columns):
    """The example's pipeline: VectorAssembler, StandardScaler, then the KerasEstimator, fitted as one."""
    estimator = KerasEstimator(model=mlp(0.01), featuresCol="features", labelCol="digit", epochs=5, batchSize=64,
                               numWorkers=2, seed=1, verbose=0)
    return Pipeline(stages=[*featurizer().getStages(), estimator]).fit(pixel_columns[0])


def test_params_are_pyspark_mls(pixel_columns):
    estimator = KerasEstimator(model=mlp(0.01), featuresCol="f", epochs=3)
    assert (estimator.getOrDefault("epochs"), estimator.getFeaturesCol(), estimator.getLabelCol(),
            estimator.getPredictionCol(), estimator.getOrDefault("numWorkers")) == (3, "f", "label", "prediction", 2)
    assert "numWorkers: Spark barrier tasks, one TensorFlow worker each (default: 2)" in estimator.explainParams()
    copied = estimator.copy({estimator.epochs: 7})
    assert (copied.getOrDefault("epochs"), estimator.getOrDefault("epochs")) == (7, 3)
    assert estimator.setParams(batchSize=128) is estimator and estimator.getOrDefault("batchSize") == 128
    with pytest.raises(InvalidArgumentError, match="KerasEstimator needs model="):
        KerasEstimator(featuresCol="f").fit(pixel_columns[0])


def test_a_pipeline_assembles_scales_trains_and_scores(pipeline_model, pixel_columns):
    trained = pipeline_model.stages[-1]
    assert isinstance(trained, KerasModel)
    assert len(trained.history["loss"]) == 5 and [worker["index"] for worker in trained.workers] == [0, 1]
    scored = pipeline_model.transform(pixel_columns[1])
    assert accuracy().evaluate(scored) >= 0.9
    local = scored.select(vector_to_array("features").alias("x"), "prediction").toPandas()
    assert (local["prediction"].to_numpy() == predict_local(trained.keras_model, np.stack(local["x"]))).all()


def test_a_saved_pipeline_model_loads_and_predicts_the_same(pipeline_model, pixel_columns, tmp_path):
    path = str(tmp_path / "pipeline")
    pipeline_model.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    trained, reloaded = pipeline_model.stages[-1], loaded.stages[-1]
    assert isinstance(reloaded, KerasModel) and reloaded.history == trained.history
    assert (reloaded.getFeaturesCol(), reloaded.uid) == ("features", trained.uid)
    assert len(list(tmp_path.glob("pipeline/stages/*/model.keras"))) == 1
    before, after = (model.transform(pixel_columns[1]).select("prediction").toPandas()["prediction"]
                     for model in (pipeline_model, loaded))
    assert before.equals(after)


def test_cross_validator_trains_each_folds_grid_at_once_and_picks_the_better(pixel_columns, tmp_path):
    estimator = KerasEstimator(featuresCol="raw", labelCol="digit", epochs=4, batchSize=64, numWorkers=1, seed=1,
                               verbose=0, fitArgs={"callbacks": meet_in_pairs(str(tmp_path), pairs=2)})
    grid = ParamGridBuilder().addGrid(estimator.model, [mlp(0.0001), mlp(0.01)]).build()
    search = CrossValidator(estimator=estimator, estimatorParamMaps=grid, evaluator=accuracy(), numFolds=2, seed=7,
                            collectSubModels=True)
    chosen = search.fit(VectorAssembler(inputCols=PIXELS, outputCol="raw").transform(pixel_columns[0]))
    assert len(chosen.avgMetrics) == 2 and chosen.avgMetrics[1] > chosen.avgMetrics[0]
    assert chosen.bestModel.keras_model.optimizer.get_config()["learning_rate"] == pytest.approx(0.01)
    # Each fold's two models met at the end of their training (models trained in turn fail), so by their
    # chiefs' clocks each one's first step came before the other's end.
    for fold in chosen.subModels:
        first, second = (model.workers[0] for model in fold)
        assert first["first_step_at"] < second["finished_at"] and second["first_step_at"] < first["finished_at"]


def test_train_validation_split_picks_the_better_of_its_grid(pixel_columns):
    estimator = KerasEstimator(featuresCol="raw", labelCol="digit", epochs=3, batchSize=64, numWorkers=1, seed=1,
                               verbose=0)
    grid = ParamGridBuilder().addGrid(estimator.model, [mlp(0.0001), mlp(0.01)]).build()
    split = TrainValidationSplit(estimator=estimator, estimatorParamMaps=grid, evaluator=accuracy(), trainRatio=0.75,
                                 seed=7)
    chosen = split.fit(VectorAssembler(inputCols=PIXELS, outputCol="raw").transform(pixel_columns[0]))
    assert chosen.validationMetrics[1] > chosen.validationMetrics[0]
    assert chosen.bestModel.keras_model.optimizer.get_config()["learning_rate"] == pytest.approx(0.01)
