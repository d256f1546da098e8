"""Quantized frozen weights computed in float one layer at a time (models/quantized.py): the same numbers as Keras's
weight-only layers give, without a step holding every layer's float weights at once."""

import gc
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfbarrier.models import quantized

WIDTH, LAYERS = 4096, 6  # 6 kernels of 64 MB in float, 16 MB in int8


def frozen_stack(mode):
    """LAYERS frozen Dense layers built quantized in ``mode`` (never holding float kernels), the last with LoRA
    adapters, inputs in float as tfbarrier quantizes; the same seed, the same weights."""
    keras.utils.set_random_seed(3)
    config = keras.quantizers.Int8QuantizationConfig(activation_quantizer=None) if mode == "int8" else None
    layers = [keras.layers.Dense(WIDTH, use_bias=False, dtype=f"{mode}_from_float32", quantization_config=config)
              for _ in range(LAYERS)]
    model = keras.Sequential([keras.Input((WIDTH,)), *layers])
    for layer in layers:
        layer.trainable = False
    layers[-1].enable_lora(2)
    return model


def step_of(model):
    """A traced training step's loss and gradients (of the inputs, and of the adapters)."""

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.square(model(x)))
        return loss, tape.gradient(loss, [x, *model.trainable_variables])

    return step


def vm_peak_growth(call):
    """How far this process's peak resident memory rose past its resident memory while ``call`` ran (Linux's VmHWM,
    reset first)."""
    def status(key):
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith(key)).split()[1]) * 1024

    gc.collect()
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak starts again from here
    call()
    return status("VmHWM") - before


def growth_of_a_step(mode, in_float):
    """In a process of its own (memory a step freed is reused by the next, unseen): how far a traced step of
    ``frozen_stack(mode)`` (computing in float where ``in_float``) rose, as a share of the float kernels' bytes."""
    output = subprocess.run([sys.executable, __file__, mode, str(in_float)], check=True, capture_output=True,
                            text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}).stdout
    return float(output.split()[-1])


@pytest.mark.parametrize("mode", quantized.MODES)
def test_a_step_computes_as_keras_does(mode):
    x = tf.constant(np.random.default_rng(0).random((32, WIDTH), dtype=np.float32))
    as_keras = step_of(frozen_stack(mode))(x)
    model = quantized.compute_in_float(frozen_stack(mode))
    assert quantized.mode_of(model) == mode
    loss, gradients = step_of(model)(x)
    np.testing.assert_allclose(loss.numpy(), as_keras[0].numpy(), rtol=1e-6)
    for got, expected in zip(gradients, as_keras[1]):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", quantized.MODES)
def test_a_step_does_not_hold_every_float_kernel_at_once(mode):
    """Keras's quantized layers, dequantized as soon as TensorFlow can, rose by about twice the float kernels' bytes
    (1.95 in int8, 2.03 in int4, fresh processes); computing in float one layer at a time, 0.22."""
    growth = growth_of_a_step(mode, in_float=True)
    assert growth < 0.5, f"a step rose by {growth:.2f} of the float kernels' bytes"


if __name__ == "__main__":  # growth_of_a_step's process
    mode, in_float = sys.argv[1], sys.argv[2] == "True"
    model = frozen_stack(mode)
    step = step_of(quantized.compute_in_float(model) if in_float else model)
    x = tf.constant(np.random.default_rng(0).random((32, WIDTH), dtype=np.float32))
    step.get_concrete_function(x)
    print(vm_peak_growth(lambda: step(x)) / (LAYERS * WIDTH * WIDTH * 4))
