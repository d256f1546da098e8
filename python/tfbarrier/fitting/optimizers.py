"""The training process's optimizer, made before the first step and holding no more than its slots.

- ``build`` makes the slots now, each worker its own (zeros, or the weights' values for an EMA, alike on
  every worker: keras_helpers.initial_values_local), instead of at the first step, where
  MultiWorkerMirroredStrategy would broadcast each from worker 0.
- tf_keras's ``SGD`` makes a momentum slot for every weight even at ``momentum=0`` (its docstring says it
  does not): a copy of the weights that only ever holds ``-lr * gradient``. ``build`` leaves it out, and
  tf_keras's own update then takes its no-momentum branch, which gives the same values.
- tf_keras's ``update_step`` writes each intermediate of a dense update (``-gradient``, ``* lr``, Adam's
  ``(gradient - m) * (1 - beta_1)``...) as a tensor the size of the weight. ``fuse_updates`` runs SGD's
  and Adam's dense updates in TensorFlow's fused kernels instead (ResourceApplyGradientDescent,
  ResourceApplyKerasMomentum, ResourceApplyAdam, ResourceApplyAdamWithAmsgrad: what tf_keras's legacy
  optimizers use), the same arithmetic in place. Other optimizers, subclasses, sparse gradients and XLA
  (``jit_compile``, which fuses them itself) keep tf_keras's update.

Imported only in training processes, after TensorFlow.
"""

import tensorflow as tf
import tf_keras

from tfbarrier import keras_helpers

FUSED_DTYPES = (tf.float32, tf.float64)


def build(model, strategy, variables=None):
    """Make ``model``'s optimizer's slots now for ``variables`` (None: every trainable one; fewer where the
    exchange shards the optimizer's state), for tf_keras's optimizers (a legacy one makes its slots as it goes),
    without plain SGD's unused momentum."""
    optimizer = keras_helpers.inner_optimizer(model.optimizer)
    variables = model.trainable_variables if variables is None else variables
    if not isinstance(optimizer, tf_keras.optimizers.Optimizer):
        return
    with keras_helpers.initial_values_local(strategy):
        if type(optimizer) is tf_keras.optimizers.SGD and not optimizer.momentum:
            super(tf_keras.optimizers.SGD, optimizer).build(variables)  # the iterations, an EMA's averages
            optimizer.momentums = [None] * len(variables)
            optimizer._built = True  # what SGD.build sets: no later build makes the slots after all
        else:
            optimizer.build(variables)


def fuse_updates(model):
    """Make ``model``'s optimizer apply its dense updates in TensorFlow's fused kernels (SGD and Adam)."""
    optimizer = keras_helpers.inner_optimizer(model.optimizer)
    kernel = {tf_keras.optimizers.SGD: _sgd, tf_keras.optimizers.Adam: _adam}.get(type(optimizer))
    if kernel is None or optimizer.jit_compile:
        return
    keras_update = optimizer.update_step

    def update_step(gradient, variable):
        if isinstance(gradient, tf.Tensor) and variable.dtype in FUSED_DTYPES and gradient.dtype == variable.dtype:
            return kernel(optimizer, gradient, variable)
        return keras_update(gradient, variable)

    optimizer.update_step = update_step  # shadows the class's method on this instance only


def _slot(slots, optimizer, variable):
    return slots[optimizer._index_dict[optimizer._var_key(variable)]]


def _sgd(optimizer, gradient, variable):
    lr = tf.cast(optimizer.learning_rate, variable.dtype)
    momentum = _slot(optimizer.momentums, optimizer, variable)
    if momentum is None:
        return tf.raw_ops.ResourceApplyGradientDescent(var=variable.handle, alpha=lr, delta=gradient)
    return tf.raw_ops.ResourceApplyKerasMomentum(
        var=variable.handle, accum=momentum.handle, lr=lr, grad=gradient,
        momentum=tf.cast(optimizer.momentum, variable.dtype), use_nesterov=bool(optimizer.nesterov))


def _adam(optimizer, gradient, variable):
    dtype = variable.dtype
    step = tf.cast(optimizer.iterations + 1, dtype)
    beta_1, beta_2 = tf.cast(optimizer.beta_1, dtype), tf.cast(optimizer.beta_2, dtype)
    beta_1_power, beta_2_power = tf.pow(beta_1, step), tf.pow(beta_2, step)
    epsilon = tf.cast(optimizer.epsilon, dtype)
    if getattr(optimizer, "adaptive_epsilon", False):
        epsilon = epsilon * tf.sqrt(1 - beta_2_power)
    arguments = dict(var=variable.handle, m=_slot(optimizer._momentums, optimizer, variable).handle,
                     v=_slot(optimizer._velocities, optimizer, variable).handle, beta1_power=beta_1_power,
                     beta2_power=beta_2_power, lr=tf.cast(optimizer.learning_rate, dtype), beta1=beta_1,
                     beta2=beta_2, epsilon=epsilon, grad=gradient)
    if optimizer.amsgrad:
        return tf.raw_ops.ResourceApplyAdamWithAmsgrad(
            vhat=_slot(optimizer._velocity_hats, optimizer, variable).handle, **arguments)
    return tf.raw_ops.ResourceApplyAdam(**arguments)


def fuse_keras3_updates(optimizer):
    """The same for a Keras 3 optimizer (a native fit's, fitting/flavors.py), whose ``update_step`` also
    takes the learning rate and writes each intermediate as a tensor the size of the weight (the 61 M
    MLP's Adam peaked 13% above the translated path's fused one, bench/README.md)."""
    import keras

    kernel = {keras.optimizers.SGD: _keras3_sgd, keras.optimizers.Adam: _keras3_adam}.get(type(optimizer))
    if kernel is None:
        return
    keras_update = optimizer.update_step

    def update_step(gradient, variable, learning_rate):
        if isinstance(gradient, tf.Tensor) and variable.dtype in ("float32", "float64") \
                and gradient.dtype.name == variable.dtype:
            return kernel(optimizer, gradient, variable, tf.cast(learning_rate, variable.dtype))
        return keras_update(gradient, variable, learning_rate)

    optimizer.update_step = update_step


def _keras3_sgd(optimizer, gradient, variable, lr):
    if not optimizer.momentum:
        return tf.raw_ops.ResourceApplyGradientDescent(var=variable.handle, alpha=lr, delta=gradient)
    momentum = optimizer.momentums[optimizer._get_variable_index(variable)]
    return tf.raw_ops.ResourceApplyKerasMomentum(
        var=variable.handle, accum=momentum.handle, lr=lr, grad=gradient,
        momentum=tf.cast(optimizer.momentum, variable.dtype), use_nesterov=bool(optimizer.nesterov))


def _keras3_adam(optimizer, gradient, variable, lr):
    dtype, index = variable.dtype, optimizer._get_variable_index(variable)
    step = tf.cast(optimizer.iterations + 1, dtype)
    beta_1, beta_2 = tf.cast(optimizer.beta_1, dtype), tf.cast(optimizer.beta_2, dtype)
    arguments = dict(var=variable.handle, m=optimizer._momentums[index].handle, v=optimizer._velocities[index].handle,
                     beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step), lr=lr, beta1=beta_1,
                     beta2=beta_2, epsilon=tf.cast(optimizer.epsilon, dtype), grad=gradient)
    if optimizer.amsgrad:
        return tf.raw_ops.ResourceApplyAdamWithAmsgrad(vhat=optimizer._velocity_hats[index].handle, **arguments)
    return tf.raw_ops.ResourceApplyAdam(**arguments)
