"""Encoded images as features: PNG files read with Spark's binaryFile source, decoded in the training
processes (fit) and on the executors (predict); broken files are named by their row."""

import io
import os

import numpy as np
import pandas as pd
import pytest
from conftest import left_behind, partitioned

import tfbarrier
from tfbarrier.errors import ColumnError, ModelError

LABEL_FROM_PATH = r"digit_(\d)_\d+\.png$"


def png(pixels):
    """An 8x8 grayscale PNG of ``pixels`` (values 0-255)."""
    import tensorflow as tf

    return tf.io.encode_png(np.asarray(pixels, np.uint8).reshape(8, 8, 1)).numpy()


def decode(contents):
    import tensorflow as tf

    return np.stack([tf.io.decode_png(c, channels=1).numpy() for c in contents]).astype("float32")


def write_pngs(directory, frame):
    """The digits (scaled to 0-255) as PNG files named digit_<label>_<row>.png."""
    os.makedirs(directory)
    for i, (pixels, digit) in enumerate(zip(frame["pixels"], frame["digit"])):
        with open(os.path.join(directory, f"digit_{digit}_{i}.png"), "wb") as f:
            f.write(png(np.round(pixels * 255)))


def image_cnn():
    """The slides' CNN for 8x8x1 images in 0-255: the model rescales them itself."""
    import keras

    keras.utils.set_random_seed(2)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def read_images(spark, directory):
    from pyspark.sql import functions as F

    return (spark.read.format("binaryFile").load(directory)
            .withColumn("digit", F.regexp_extract("path", LABEL_FROM_PATH, 1).cast("int")))


@pytest.fixture(scope="module")
def image_dirs(tmp_path_factory, digits):
    root = tmp_path_factory.mktemp("images")
    write_pngs(str(root / "train"), digits[0])
    write_pngs(str(root / "held_out"), digits[1])
    return str(root / "train"), str(root / "held_out")


@pytest.fixture(scope="module")
def image_fit(spark, image_dirs):
    df = read_images(spark, image_dirs[0])
    return tfbarrier.fit(df, image_cnn(), features="content", label="digit", epochs=5, batch_size=64,
                         num_workers=2, seed=1)


def test_two_workers_learn_digits_from_png_files_to_90_percent_held_out(spark, image_fit, image_dirs):
    held_out = read_images(spark, image_dirs[1]).select("content", "digit").toPandas()
    assert len(held_out) == 300
    predicted = np.argmax(image_fit.model.predict(decode(held_out["content"]), verbose=0), axis=1)
    assert np.mean(predicted == held_out["digit"].to_numpy()) >= 0.9
    assert sum(w["rows"] for w in image_fit.workers) == 1497


def test_predict_on_png_files_matches_local_predict_row_for_row(spark, image_fit, image_dirs):
    df = read_images(spark, image_dirs[1]).repartition(3)
    scored = tfbarrier.predict(df, image_fit, features="content", output="raw", batch_size=32)
    frame = scored.select("path", "content", "prediction").toPandas()
    local = image_fit.model.predict(decode(frame["content"]), verbose=0)
    np.testing.assert_allclose(np.stack(frame["prediction"].to_numpy()), local, rtol=1e-4, atol=1e-4)


def test_a_corrupt_image_fails_the_fit_with_its_row_in_the_partition(spark, digits):
    frame = digits[0].iloc[:64].reset_index(drop=True)
    rows = pd.DataFrame({"content": [png(np.round(p * 255)) for p in frame["pixels"]], "digit": frame["digit"]})
    rows.loc[40, "content"] = rows.loc[40, "content"][:30]  # a truncated file: row 8 of partition 1
    df = partitioned(spark, rows, lambda i: int(i >= 32), 2)
    with pytest.raises(ColumnError, match=r"row 8 of this worker's partition does not decode") as caught:
        tfbarrier.fit(df, image_cnn(), features="content", label="digit", batch_size=16, num_workers=2,
                      verbose=0)
    assert caught.value.worker == 1
    assert left_behind() == []


def encoded(pixels, image_format, mode="L", scale=1):
    """An 8x8 grayscale image as a file of ``image_format`` (Pillow's), stored in ``mode`` ("L", "RGB"),
    each pixel a ``scale`` x ``scale`` block."""
    from PIL import Image

    image = Image.fromarray(np.asarray(pixels, np.uint8).reshape(8, 8))
    image = image.resize((8 * scale, 8 * scale), Image.NEAREST).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    return buffer.getvalue()


def test_jpeg_gif_bmp_color_and_larger_images_are_decoded_to_the_models_input(spark, digits):
    """Each file becomes the model's (8, 8, 1) in 0-255: color made gray, a 16x16 image resized (its 2x2
    blocks average to the pixel), a JPEG as Pillow decodes it (lossy: within 2 levels)."""
    import keras
    from PIL import Image

    cases = [("PNG", "L", 1), ("BMP", "RGB", 1), ("GIF", "L", 1), ("PNG", "RGB", 2), ("JPEG", "L", 1)]
    images = [np.round(p * 255) for p in digits[1]["pixels"][:4]]
    rows = pd.DataFrame([{"content": encoded(pixels, *case), "case": " ".join(map(str, case)), "image": i}
                         for i, pixels in enumerate(images) for case in cases])
    identity = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                 keras.layers.Dense(64, use_bias=False, kernel_initializer="identity")])
    scored = tfbarrier.predict(spark.createDataFrame(rows), identity, features="content", output="raw").toPandas()
    for _, row in scored.iterrows():
        got = np.asarray(row["prediction"])
        if row["case"].startswith("JPEG"):
            expected = np.asarray(Image.open(io.BytesIO(row["content"])).convert("L"), np.float32).ravel()
            np.testing.assert_allclose(got, expected, atol=2, err_msg=row["case"])
        else:
            np.testing.assert_allclose(got, images[row["image"]].ravel(), atol=1, err_msg=row["case"])


def test_images_are_decoded_to_a_four_channel_input_opaque(spark, digits):
    """RGBA input: a GIF or a BMP (which TensorFlow decodes to RGB) gets an opaque alpha, as a PNG saved
    as RGBA has."""
    import keras

    pixels = np.round(digits[1]["pixels"][0] * 255)
    cases = [("GIF", "L"), ("BMP", "RGB"), ("PNG", "RGBA")]
    rows = pd.DataFrame({"content": [encoded(pixels, *case) for case in cases]})
    identity = keras.Sequential([keras.Input((8, 8, 4)), keras.layers.Flatten(),
                                 keras.layers.Dense(256, use_bias=False, kernel_initializer="identity")])
    scored = tfbarrier.predict(spark.createDataFrame(rows), identity, features="content", output="raw").toPandas()
    expected = np.stack([pixels, pixels, pixels, np.full(64, 255.0)], axis=-1).ravel()
    for case, got in zip(cases, scored["prediction"]):
        np.testing.assert_allclose(np.asarray(got), expected, atol=1, err_msg=str(case))


def test_predict_on_a_corrupt_image_fails_with_its_row_in_the_partition(spark, image_fit, digits):
    frame = digits[1].iloc[:8].reset_index(drop=True)
    rows = pd.DataFrame({"content": [png(np.round(p * 255)) for p in frame["pixels"]]})
    rows.loc[5, "content"] = rows.loc[5, "content"][:30]
    df = partitioned(spark, rows, lambda i: int(i >= 4), 2)  # row 1 of partition 1
    with pytest.raises(Exception, match=r"row 1 of the partition does not decode as an image"):
        tfbarrier.predict(df, image_fit, features="content").collect()


def test_spark_image_source_is_refused_with_the_binary_file_fix(spark, image_dirs):
    df = spark.read.format("image").load(image_dirs[1])
    with pytest.raises(ColumnError, match="binaryFile"):
        tfbarrier.fit(df.withColumn("digit", df.image.width), image_cnn(), features="image", label="digit")


def test_a_flat_model_input_is_refused_for_images_before_any_job(spark, image_dirs):
    import keras

    flat = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    flat.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ModelError, match=r"\(height, width, channels\)"):
        tfbarrier.fit(read_images(spark, image_dirs[1]), flat, features="content", label="digit")
