"""A Keras model as a stage of a Spark ML pipeline: VectorAssembler -> StandardScaler -> a KerasEstimator
tuned by CrossValidator over two learning rates (each fold's two models train at the same time),
scored by MulticlassClassificationEvaluator, saved and loaded as a PipelineModel.

The data is scikit-learn's 8x8 digits with each pixel in a column of its own, as tabular data
arrives in Spark (no network here).

    .venv/bin/python examples/spark_ml_pipeline.py
"""

import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors need this interpreter's packages
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PIXELS = [f"p{i}" for i in range(64)]


def mlp(learning_rate):
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def featurizer():
    """Assemble the pixel columns into a vector and scale it: the features the Keras model trains on."""
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StandardScaler, VectorAssembler

    return Pipeline(stages=[VectorAssembler(inputCols=PIXELS, outputCol="raw"),
                            StandardScaler(inputCol="raw", outputCol="features")])


def main():
    import numpy as np
    import pandas as pd
    from pyspark.ml import PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    from tfbarrier.ml import KerasEstimator

    spark = (SparkSession.builder.master("local[2]").appName("tfbarrier-spark-ml")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    x, y = load_digits(return_X_y=True)
    df = spark.createDataFrame(pd.DataFrame(x, columns=PIXELS).assign(digit=y.astype(np.int64)))
    train, held_out = df.randomSplit([0.8, 0.2], seed=0)

    features = featurizer().fit(train)
    estimator = KerasEstimator(featuresCol="features", labelCol="digit", epochs=5, batchSize=64, numWorkers=1,
                               seed=1, verbose=0)
    grid = ParamGridBuilder().addGrid(estimator.model, [mlp(0.001), mlp(0.01)]).build()
    accuracy = MulticlassClassificationEvaluator(labelCol="digit", metricName="accuracy")
    # The KerasEstimator itself is CrossValidator's estimator, so each fold's grid trains at once
    # (a whole Pipeline as the estimator fits its grid one model at a time unless parallelism= is set).
    search = CrossValidator(estimator=estimator, estimatorParamMaps=grid, evaluator=accuracy, numFolds=2, seed=0)
    chosen = search.fit(features.transform(train).cache())
    print("cross-validated accuracy, learning rates 0.001 and 0.01: "
          + ", ".join(f"{value:.4f}" for value in chosen.avgMetrics))
    best = PipelineModel(stages=[*features.stages, chosen.bestModel])
    print(f"held-out accuracy of the best pipeline: {accuracy.evaluate(best.transform(held_out)):.4f}")

    with tempfile.TemporaryDirectory() as directory:
        best.write().save(os.path.join(directory, "digits-pipeline"))
        loaded = PipelineModel.load(os.path.join(directory, "digits-pipeline"))
        print(f"held-out accuracy of the saved and loaded pipeline: {accuracy.evaluate(loaded.transform(held_out)):.4f}")
    spark.stop()


if __name__ == "__main__":
    main()
