"""communication={"shard": "optimizer"} over tfbarrier's ring (exchange/sharded_update.py): each worker holds the
optimizer's state of its own share of the weights, and the fit still ends as one process's would: the same
weights and history, for tf_keras and Keras 3 models and the optimizers people compile with (momentum, Adam,
AdamW with a schedule and clipping by the global norm, which must be every shard's)."""

import keras
import numpy as np
import pytest
from test_native import (GLOBAL_BATCH, Gate, huberish, line_df, one_process,  # noqa: F401 - line_df: a fixture
                         resumes_as_if_uninterrupted, trained_as_one_process)

import tfbarrier

OPTIMIZERS = {
    # a schedule that halves the rate every 3 steps (read from the step count, which a pack-by-pack update must
    # count once a step)
    "sgd_momentum": lambda k: k.optimizers.SGD(k.optimizers.schedules.ExponentialDecay(0.05, 3, 0.5), momentum=0.9),
    "adam": lambda k: k.optimizers.Adam(0.01),
    # a norm of 0.05 clips every step's gradients
    "adamw_schedule_global_clipnorm": lambda k: k.optimizers.AdamW(
        k.optimizers.schedules.ExponentialDecay(0.02, 3, 0.5), weight_decay=0.1, global_clipnorm=0.05),
}


def tf_keras_model(optimizer):
    import tf_keras

    tf_keras.utils.set_random_seed(11)
    model = tf_keras.Sequential([tf_keras.Input((8,)), tf_keras.layers.Dense(16, activation="tanh"),
                                 tf_keras.layers.Dense(8, activation="tanh"), tf_keras.layers.Dense(1)])
    model.compile(optimizer=OPTIMIZERS[optimizer](tf_keras), loss="mse", metrics=["mae"])
    return model


def keras3_model(optimizer):  # a custom layer: it trains natively, in Keras 3
    import keras

    keras.utils.set_random_seed(11)
    inputs = keras.Input((8,))
    hidden = Gate()(keras.layers.Dense(16)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="tanh")(hidden)))
    model.compile(optimizer=OPTIMIZERS[optimizer](keras), loss=huberish, metrics=["mae"])
    return model


# each optimizer in each Keras once at least (test_exchanges fits tf_keras's Adam, clipped, on 4 workers). Each
# gradient in a pack of its own (bytes_per_pack 4): a worker owns nothing in some packs, all of others, a cut
# kernel's pack is its blocks, and each pack is gathered into its variable where it lies (after the pack-by-pack
# update, or, clipped by the global norm, after the one update); Keras 3's AdamW: one pack of every gradient,
# gathered through a buffer
@pytest.mark.parametrize("make, optimizer, packs", [
    (tf_keras_model, "sgd_momentum", {"bytes_per_pack": 4}), (keras3_model, "adam", {"bytes_per_pack": 4}),
    (tf_keras_model, "adamw_schedule_global_clipnorm", {"bytes_per_pack": 4}),
    (keras3_model, "adamw_schedule_global_clipnorm", {})],
    ids=["tf_keras-sgd_momentum", "keras3-adam", "tf_keras-adamw", "keras3-adamw"])
def test_two_workers_holding_half_the_optimizer_state_each_train_as_one_process(spark, line_df, make,  # noqa: F811
                                                                                 optimizer, packs, tmp_path):
    model, reference = make(optimizer), make(optimizer)
    result = tfbarrier.fit(line_df, model, features="x", label="y", epochs=2, batch_size=GLOBAL_BATCH,
                           num_workers=2, shuffle=False, communication={"shard": "optimizer", **packs},
                           save_to=str(tmp_path), verbose=0)
    history = one_process(reference, epochs=2)

    trained_as_one_process(result, model, reference, history)
    held = [w["communication"]["state_of_weights"] for w in result.workers]
    assert sum(held) == model.count_params() and 0 < min(held), held  # each its share, together every weight
    saved = saved_model(tmp_path / "epoch-002.keras", make)  # no worker holds the optimizer's whole state: none
    assert int(saved.optimizer.iterations.numpy()) == 0  # (a shard of it would say 12 steps)
    for trained, kept in zip(result.model.get_weights(), saved.get_weights()):
        np.testing.assert_array_equal(trained, kept)


class NudgesWorkerOnesKernel(keras.callbacks.Callback):
    """After the first step, a trainable weight of worker 1 (the first kernel, cut in two blocks: the model's
    largest, or the one at ``index``) changed there alone."""

    def __init__(self, index=0):
        super().__init__()
        self.index = index

    def on_train_batch_end(self, batch, logs=None):
        import json
        import os

        if batch == 0 and json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
            kernel = self.model.trainable_variables[self.index]
            kernel.assign(kernel + 1.0)


# the check that the other workers' updates reached each worker's copy (shards.SyncBlocks): a cut kernel's rows,
# and the output layer's kernel, held whole by one worker and, in a pack of its own, received where it lies
@pytest.mark.parametrize("index, packs", [(0, {}), (-2, {"bytes_per_pack": 4})], ids=["cut", "held_whole"])
def test_a_kernel_that_differs_across_the_workers_after_the_first_step_fails_the_fit_naming_it(spark, line_df,  # noqa: F811
                                                                                              index, packs):
    with pytest.raises(tfbarrier.errors.ModelError, match=r"copies of \S*kernel differ after the first step"):
        tfbarrier.fit(line_df, keras3_model("adam"), features="x", label="y", epochs=1, batch_size=GLOBAL_BATCH,
                      num_workers=2, steps_per_epoch=2, verbose=0, communication={"shard": "optimizer", **packs},
                      callbacks=lambda: [NudgesWorkerOnesKernel(index)])


def saved_model(path, make):
    if make is tf_keras_model:
        import tf_keras

        return tf_keras.models.load_model(path)
    import keras

    return keras.saving.load_model(path, custom_objects={"Gate": Gate, "huberish": huberish})


@pytest.mark.parametrize("make", [tf_keras_model, keras3_model], ids=["tf_keras", "keras3"])
def test_a_worker_killed_mid_epoch_resumes_from_every_workers_shard_as_if_uninterrupted(spark, line_df, make,  # noqa: F811
                                                                                        tmp_path):
    def fit(**kwargs):
        return tfbarrier.fit(line_df, make("adam"), features="x", label="y", epochs=3, batch_size=GLOBAL_BATCH,
                             num_workers=2, seed=7, verbose=0, communication={"shard": "optimizer"}, **kwargs)

    resumes_as_if_uninterrupted(fit, tmp_path)


@pytest.mark.parametrize("last_layers_first", [True, False], ids=["last_layers_first", "first_layers_first"])
def test_the_backward_pass_waits_for_the_exchange_packs_before_and_makes_the_same_gradients(last_layers_first):
    """ZeRO's stage 2 as the sharded step runs it (held_back): the backward pass's operations that make a pack's
    gradients wait for the exchange of the pack PACKS_AHEAD before it, so a worker never holds every gradient at
    once. In the order the ring sends (last layers first) every later pack waits; in the other, where waiting could
    make a cycle (the first layer's gradient needs every later layer's), the step still runs. The gradients are
    the same either way. (Before, no operation waited: a 65 M model's step held about 200 MB of its 248 MB of
    gradients at once, bench/README.md.)"""
    import tensorflow as tf

    from tfbarrier.exchange.sharded_update import PACKS_AHEAD, held_back

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), *[keras.layers.Dense(8, activation="tanh") for _ in range(5)],
                              keras.layers.Dense(1)])
    x = tf.random.stateless_normal((4, 8), (1, 2))
    held = []

    def gradients(hold):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            packed = [[(i, g)] for i, g in enumerate(grads)][::-1 if last_layers_first else 1]
            after, ancestors = [], set()
            for number, pack in enumerate(packed):
                with tf.control_dependencies(after):
                    exchange = tf.identity(pack[0][1])  # a pack's exchange: it reads the pack's gradients
                after = [exchange]
                if hold and number + PACKS_AHEAD < len(packed):
                    held.append(held_back(packed[number + PACKS_AHEAD], exchange, ancestors))
            with tf.control_dependencies(after):
                return [tf.identity(g) for g in grads]

        return [g.numpy() for g in step()]

    unheld, waited = gradients(False), gradients(True)
    for a, b in zip(unheld, waited):
        np.testing.assert_allclose(b, a, rtol=1e-6)
    assert len(held) == len(model.trainable_variables) - PACKS_AHEAD
    if last_layers_first:
        assert all(count > 0 for count in held), held


def test_a_weight_tensorflow_copies_at_every_read_fails_in_words_instead_of_not_training(spark):
    """An embedding whose table is also the output layer (tied weights) gets a dense gradient, so it is sharded,
    and cut into a block of rows per worker; but its lookup leaves TensorFlow's variable copying itself at every
    read, so the step's write of the updated rows into it (``_gathered_into``) lands in a copy. Before, the fit
    ended without an error and the table never trained (every worker's copy equally stale)."""
    from tfbarrier.errors import ModelError

    tied_language_model()  # its class registered here too, where the trained model's archive is loaded
    with pytest.raises(ModelError, match="table.*did not take its updated rows"):
        tfbarrier.fit(ids_df(spark), lambda: tied_model(16), features="x", label="y", epochs=1, batch_size=16,
                      num_workers=2, verbose=0,
                      communication={"shard": "optimizer", "bytes_per_pack": 4})  # the table in a pack of its own


def test_a_table_held_whole_and_looked_up_trains_its_other_workers_copy_through_a_buffer(spark):
    """The same tied table, a small part of a wider model's weights, is held whole by one worker; the step
    receives most weights held whole straight into their variables (``_gathered_into``), but not one TensorFlow
    copies at every read (``_written_where_they_lie``: its lookup is in the step): it is written through a buffer,
    and every worker's copy trains. Received in place, the other worker's copy would not have changed (SyncBlocks
    fails the fit)."""
    from tfbarrier.exchange.placement import pieces

    model = tied_model(128)
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    table = [v.name.endswith("table:0") for v in model.trainable_variables].index(True)
    assert len(pieces(shapes, [4] * len(shapes), 2)[table]) == 1  # held whole by one worker
    result = tfbarrier.fit(ids_df(spark), lambda: tied_model(128), features="x", label="y", epochs=2, batch_size=16,
                           num_workers=2, verbose=0, communication={"shard": "optimizer", "bytes_per_pack": 4})
    trained = [v for v in result.model.trainable_variables if v.name.endswith("table:0")][0].numpy()
    assert not np.allclose(trained, model.trainable_variables[table].numpy())  # it trained


def ids_df(spark):
    import pandas as pd

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": list(rng.integers(0, 64, (64, 4)).astype("int32")), "y": rng.integers(0, 64, 64)})
    return spark.createDataFrame(frame).repartition(2)


def tied_model(width):
    """A tf_keras model of TiedLanguageModel (tied_language_model) whose hidden layers are ``width`` wide."""
    import tf_keras

    tf_keras.utils.set_random_seed(3)
    ids = tf_keras.Input((4,), dtype="int32")
    model = tf_keras.Model(ids, tied_language_model()(width)(ids))
    model.compile(optimizer=tf_keras.optimizers.Adam(0.01),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_block_is_compared_with_its_rows_a_segment_at_a_time_to_its_last_row_nan_equal_to_nan():
    """Shards.unwritten (SyncBlocks' check after the first step): each block against its variable's rows, a
    segment at a time (read whole, the two cost up to 0.3 GB above a 150 M model's step, bench/README.md). A
    difference in the block's last row is found, one in the next worker's rows is not this block's; a weight gone
    NaN on both sides (a diverged first step) is the block's own value, not a write that did not land."""
    import tensorflow as tf

    from tfbarrier.exchange.ring import rows_per_segment
    from tfbarrier.exchange.shards import Shards

    rows = 5 * rows_per_segment((1, 1))  # rank 0's block: the first 2.5 segments' rows
    table = tf.Variable(tf.zeros((rows, 1)))
    shards = Shards([table], rank=0, size=2)
    assert shards.is_cut(table) and shards.unwritten() == []
    table[rows // 2, 0].assign(2.0)  # rank 1's first row
    assert shards.unwritten() == []
    table[rows // 2 - 1, 0].assign(1.0)
    assert [v is table for v in shards.unwritten()] == [True]
    table.assign(tf.fill((rows, 1), float("nan")))
    shards.sync()
    assert shards.unwritten() == []


def tied_language_model():
    """The class of a layer whose output layer is its table of embeddings, transposed, registered with tf_keras."""
    import tensorflow as tf
    import tf_keras

    @tf_keras.saving.register_keras_serializable(package="test_sharded")
    class TiedLanguageModel(tf_keras.layers.Layer):
        def __init__(self, width=16, **kwargs):
            super().__init__(**kwargs)
            self.width = width

        def build(self, input_shape):
            # at width 16 most of the weights: cut in blocks; at 128 a fifth of them, held whole
            self.table = self.add_weight(name="table", shape=(64, 16))
            self.hidden = tf_keras.Sequential([tf_keras.layers.Dense(self.width), tf_keras.layers.Dense(16)])

        def call(self, ids):
            hidden = self.hidden(tf.reduce_mean(tf.gather(self.table, ids), axis=1))
            return tf.matmul(hidden, self.table, transpose_b=True)

        def get_config(self):
            return {**super().get_config(), "width": self.width}

    return TiedLanguageModel
