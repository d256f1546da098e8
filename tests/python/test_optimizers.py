"""The training process's optimizer (optimizers.py): fused updates give tf_keras's own values, plain
SGD keeps no momentum slot. In this process, without Spark: the arithmetic is TensorFlow's alone."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tfbarrier.fitting import optimizers

FUSED_KERNELS = {"ResourceApplyGradientDescent", "ResourceApplyKerasMomentum", "ResourceApplyAdam",
                 "ResourceApplyAdamWithAmsgrad"}

OPTIMIZERS = {
    "sgd": (lambda: tf_keras.optimizers.SGD(0.1), "ResourceApplyGradientDescent"),
    "sgd_schedule": (lambda: tf_keras.optimizers.SGD(tf_keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5)),
                     "ResourceApplyGradientDescent"),
    "momentum": (lambda: tf_keras.optimizers.SGD(0.1, momentum=0.9), "ResourceApplyKerasMomentum"),
    "nesterov": (lambda: tf_keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), "ResourceApplyKerasMomentum"),
    "adam": (lambda: tf_keras.optimizers.Adam(0.01), "ResourceApplyAdam"),
    "amsgrad": (lambda: tf_keras.optimizers.Adam(0.01, amsgrad=True), "ResourceApplyAdamWithAmsgrad"),
}


def model_with(optimizer):
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.Input((6,)), tf_keras.layers.Dense(5, activation="relu"),
                                 tf_keras.layers.Dense(3)])
    model.compile(optimizer=optimizer, loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def update_kernels(model):
    """The fused kernels in the graph of one ``apply_gradients`` of ``model``'s optimizer."""
    grads_and_vars = [(tf.ones_like(v), v) for v in model.trainable_variables]
    graph = tf.function(lambda: model.optimizer.apply_gradients(grads_and_vars)).get_concrete_function().graph
    return {op.type for op in graph.get_operations()} & FUSED_KERNELS


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_fused_updates_give_tf_keras_own_weights_and_slots(name):
    make, kernel = OPTIMIZERS[name]
    keras_model, fused_model = model_with(make()), model_with(make())
    optimizers.build(fused_model, strategy=None)
    optimizers.fuse_updates(fused_model)
    rng = np.random.default_rng(1)
    for _ in range(4):
        x, y = rng.normal(size=(16, 6)).astype("float32"), rng.integers(0, 3, 16)
        keras_model.train_on_batch(x, y)
        fused_model.train_on_batch(x, y)
    # The same arithmetic, rounded in another order: Adam's weights differ by a few float32 ulps.
    for mine, theirs in zip(fused_model.weights, keras_model.weights):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)
    keras_slots = [v for v in keras_model.optimizer.variables if "iteration" not in v.name]
    fused_slots = [v for v in fused_model.optimizer.variables if "iteration" not in v.name]
    if name.startswith("sgd"):  # tf_keras's SGD keeps a momentum slot it does not use; here there is none
        assert len(keras_slots) == 4 and fused_slots == []
    else:
        for mine, theirs in zip(fused_slots, keras_slots, strict=True):
            np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)
    assert update_kernels(fused_model) == {kernel} and update_kernels(keras_model) == set()


class MyAdam(tf_keras.optimizers.Adam):
    """A subclass may change the update: it keeps its own."""


def test_other_optimizers_and_subclasses_keep_their_own_update():
    for optimizer in (tf_keras.optimizers.RMSprop(0.01), MyAdam(0.01)):
        model = model_with(optimizer)
        optimizers.build(model, strategy=None)
        optimizers.fuse_updates(model)
        assert "update_step" not in vars(model.optimizer) and update_kernels(model) == set()


KERAS3_OPTIMIZERS = {
    "sgd": ("SGD", {"learning_rate": 0.1}, "ResourceApplyGradientDescent"),
    "nesterov": ("SGD", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}, "ResourceApplyKerasMomentum"),
    "adam": ("Adam", {"learning_rate": 0.01}, "ResourceApplyAdam"),
    "amsgrad": ("Adam", {"learning_rate": 0.01, "amsgrad": True}, "ResourceApplyAdamWithAmsgrad"),
}


@pytest.mark.parametrize("name", KERAS3_OPTIMIZERS)
def test_fused_updates_give_keras3_own_weights_and_slots(name):
    import keras

    kind, arguments, kernel = KERAS3_OPTIMIZERS[name]

    def model():
        keras.utils.set_random_seed(0)
        built = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(3)])
        built.compile(optimizer=getattr(keras.optimizers, kind)(**arguments),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return built

    keras_model, fused_model = model(), model()
    optimizers.fuse_keras3_updates(fused_model.optimizer)
    rng = np.random.default_rng(1)
    for _ in range(4):
        x, y = rng.normal(size=(16, 6)).astype("float32"), rng.integers(0, 3, 16)
        keras_model.train_on_batch(x, y)
        fused_model.train_on_batch(x, y)
    for mine, theirs in zip(fused_model.weights + fused_model.optimizer.variables,
                            keras_model.weights + keras_model.optimizer.variables, strict=True):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)
    assert keras3_update_kernels(fused_model) == {kernel} and keras3_update_kernels(keras_model) == set()


def keras3_update_kernels(model):
    """The fused kernels in the graph (and the functions it calls) of one ``apply`` of ``model``'s optimizer."""
    variables = model.trainable_variables
    graph = tf.function(lambda: model.optimizer.apply([tf.ones(v.shape) for v in variables], variables)
                        ).get_concrete_function().graph.as_graph_def()
    nodes = [*graph.node, *[node for function in graph.library.function for node in function.node_def]]
    return {node.op for node in nodes} & FUSED_KERNELS
