"""Encoded images (PNG, JPEG, GIF, BMP) decoded in TensorFlow, as the training processes and predict's
tasks read an image column: float32 (height, width, channels) in 0-255, resized to the model's input."""


def decode_image(data, image_shape):
    """One encoded image (PNG, JPEG, GIF, BMP) as float32 (height, width, channels) in 0-255, resized
    as keras.utils.image_dataset_from_directory does."""
    import tensorflow as tf

    height, width, channels = image_shape
    image = tf.image.resize(_decoded(data, channels), (height, width))
    image.set_shape(image_shape)
    return image


def _decoded(data, channels):
    """``data`` decoded to ``channels`` (1, 3 or 4) channels, uint8. TensorFlow decodes a BMP to 3 or 4
    channels and a GIF to 3 only: to another count, they are decoded as RGB, then made gray or opaque."""
    import tensorflow as tf

    def decode(count):
        return tf.io.decode_image(data, channels=count, expand_animations=False)

    if channels == 3:
        return decode(3)

    def from_rgb():
        rgb = decode(3)
        if channels == 1:
            return tf.image.rgb_to_grayscale(rgb)
        return tf.concat([rgb, tf.fill(tf.concat([tf.shape(rgb)[:2], [1]], 0), tf.constant(255, tf.uint8))], -1)

    rgb_only = tf.logical_or(tf.equal(tf.strings.substr(data, 0, 2), "BM"), tf.equal(tf.strings.substr(data, 0, 4), "GIF8"))
    return tf.cond(rgb_only, from_rgb, lambda: decode(channels))


def undecodable_row(rows, image_shape):
    """(position, reason) of the first of ``rows`` (encoded images) that does not decode, else None."""
    import tensorflow as tf

    for position, data in enumerate(rows):
        try:
            decode_image(tf.constant(data), image_shape)
        except tf.errors.OpError as exc:
            return position, exc.message.splitlines()[0]
    return None
