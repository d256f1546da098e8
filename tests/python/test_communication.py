"""What workers exchange besides gradients: the variables' initial values (keras_helpers.py)."""

import tfbarrier


def initial_values():
    """In each of two workers, variables whose initial value is the worker's index: made as
    MultiWorkerMirroredStrategy makes them, inside ``initial_values_local``, and after it; an Adam
    optimizer's slots made by ``optimizers.build``. Returns the sums of each across the workers."""
    import json
    import os

    import tensorflow as tf
    import tf_keras

    from tfbarrier import keras_helpers
    from tfbarrier.fitting import optimizers

    index = float(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        broadcast = tf.Variable(index)
        with keras_helpers.initial_values_local(strategy):
            local = tf.Variable(index)
        after = tf.Variable(index)
        model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2, kernel_initializer="ones")])
        model.compile(optimizer=tf_keras.optimizers.Adam(), loss="mse")
        optimizers.build(model, strategy)
    slots = [v for v in model.optimizer.variables if v.shape == model.layers[0].kernel.shape]

    def total(variable):
        return float(strategy.reduce("SUM", strategy.run(lambda: tf.reduce_sum(tf.identity(variable))), axis=None))

    return {"broadcast": total(broadcast), "local": total(local), "after": total(after),
            "kernel_slots": len(slots), "slot_sum": sum(total(v) for v in slots)}


def test_initial_values_local_skips_worker_0s_broadcast_only_inside_and_optimizer_slots_are_built_alike(spark):
    sums = tfbarrier.run(initial_values, num_workers=2, verbose=0)
    # Worker 0's value (0) broadcast to both sums to 0; each worker's own (0 and 1) to 1.
    assert sums["broadcast"] == 0.0 and sums["after"] == 0.0
    assert sums["local"] == 1.0
    assert sums["kernel_slots"] == 2 and sums["slot_sum"] == 0.0  # Adam's m and v, zeros on both workers


def test_a_gradient_larger_than_a_pack_is_all_reduced_in_pieces_of_a_pack_and_joined_back():
    import numpy as np
    import tensorflow as tf

    from tfbarrier.exchange.strategy_side import in_pieces

    sent = []

    def doubling_all_reduce(grads_and_vars):  # stands for the sum over two workers holding the same gradient
        sent.append([int(tf.size(g)) * 4 if g is not None else None for g, _ in grads_and_vars])
        return [(None if g is None else 2 * g, v) for g, v in grads_and_vars]

    big = tf.reshape(tf.range(300_000, dtype=tf.float32), (600, 500))  # 1.2 MB: three pieces of at most 512 kB
    small = tf.ones((10,))
    reduced = in_pieces(doubling_all_reduce, 512 * 1024)([(big, "w"), (None, "frozen"), (small, "b")])
    assert sent == [[512 * 1024, 512 * 1024, 1_200_000 - 2 * 512 * 1024, None, 40]]
    assert [v for _, v in reduced] == ["w", "frozen", "b"] and reduced[1][0] is None
    np.testing.assert_array_equal(reduced[0][0].numpy(), 2 * big.numpy())
    np.testing.assert_array_equal(reduced[2][0].numpy(), 2 * small.numpy())
