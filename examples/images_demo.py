"""Train on a directory of image files: Spark's binaryFile source reads the encoded files, the label
comes from each file's path, and the training processes decode and resize the images themselves.

The demo writes scikit-learn's 8x8 digits as PNG files named ``<digit>/img_<n>.png`` first (no
network here); point ``IMAGES`` at your own directory of class folders instead.

    .venv/bin/python examples/images_demo.py
"""

import os
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors need this interpreter's packages
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import tfbarrier  # noqa: E402


def write_digit_pngs(root):
    """The 8x8 digits as 0-255 grayscale PNG files in one folder per class; returns how many."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    for n, (pixels, digit) in enumerate(zip(x, y)):
        os.makedirs(os.path.join(root, str(digit)), exist_ok=True)
        image = np.round(pixels * 255 / 16).astype(np.uint8).reshape(8, 8, 1)
        tf.io.write_file(os.path.join(root, str(digit), f"img_{n}.png"), tf.io.encode_png(image))
    return len(y)


def cnn(input_shape):
    import keras

    model = keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Rescaling(1 / 255),  # images arrive as float32 in 0-255
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main():
    spark = (SparkSession.builder.master("local[2]").appName("tfbarrier-images")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    images = os.environ.get("IMAGES") or tempfile.mkdtemp(prefix="tfbarrier-digits-")
    if "IMAGES" not in os.environ:
        print(f"writing {write_digit_pngs(images)} PNG files to {images}", flush=True)

    df = (spark.read.format("binaryFile").option("pathGlobFilter", "*.png").option("recursiveFileLookup", "true")
          .load(images)
          .withColumn("label", F.regexp_extract("path", r"/(\d+)/[^/]+$", 1).cast("int")))
    train, held_out = df.randomSplit([0.85, 0.15], seed=0)

    result = tfbarrier.fit(train, cnn((8, 8, 1)), features="content", label="label",
                           epochs=5, batch_size=64, num_workers=2, seed=0)
    print(result)
    scored = tfbarrier.predict(held_out, result, features="content")
    accuracy = scored.select(F.avg((F.col("prediction") == F.col("label")).cast("double"))).first()[0]
    print(f"held-out accuracy: {accuracy:.3f}")
    spark.stop()


if __name__ == "__main__":
    main()
