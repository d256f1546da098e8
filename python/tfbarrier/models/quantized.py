"""Frozen weights held quantized and computed in float, one layer at a time: QLoRA's way, with Keras's own int8 and
int4 layers.

Keras's layers, as they come, keep little of what quantization saves on TensorFlow, measured on a LoRA fine-tune
(bench/README.md, "Quantized LoRA"): its int8 layers quantize their inputs too and multiply in int8, which
TensorFlow runs on a CPU at about a third of float's speed; and a quantized layer dequantizes its kernel (for the
forward pass when its inputs stay in float, always for the backward pass) from the kernel alone, so TensorFlow's
executor, which runs an op as soon as its inputs exist, makes every layer's float kernel at the step's start: the
step held the whole model in float again, and peaked above the float model's. ``compute_in_float`` makes each
quantized layer of a model (a) multiply its float inputs by its dequantized weights (int8's inputs quantizer off;
int4's is off already), and (b) dequantize them only once its inputs exist, its backward pass recomputing the
layer once the gradient from above exists (``tf.recompute_grad``): one layer's float weights at a time, for one
more pass through the frozen layers.
"""

import functools
import warnings

MODES = ("int8", "int4")


def quantize(model, mode):
    """Quantize ``model``'s layers to ``mode`` (one of MODES), their inputs left in float."""
    import keras

    config = keras.quantizers.Int8QuantizationConfig(activation_quantizer=None) if mode == "int8" else None
    with warnings.catch_warnings():  # one per layer Keras does not quantize (norms, dropout...): as meant
        warnings.filterwarnings("ignore", message="Layer .* does not have a `quantize` method")
        model.quantize(mode, config=config)


def mode_of(model):
    """The mode (``"int8"``...) ``model``'s layers hold their weights in, None for float: its first quantized layer's
    (Keras quantizes a model's layers in one mode), found in the walk Keras's own ``Model.quantize`` makes (a private
    one: Keras has no public walk of nested layers)."""
    for layer in _layers(model):
        if layer.quantization_mode:
            return layer.quantization_mode
    return None


def compute_in_float(model):
    """``model`` (a preset's task) with each quantized layer computing as the module's docstring says: (a) and (b)."""
    for layer in _layers(model):
        if layer.quantization_mode and getattr(layer, "inputs_quantizer", None) is not None:
            layer.inputs_quantizer = None  # a preset saved in int8 comes back with Keras's default, which has one
    return one_layer_at_a_time(model)


def one_layer_at_a_time(model):
    """``model`` with each quantized layer dequantizing as (b) says, computing as its user made it (a model object
    quantized by its user: the numbers it gives in one process); in place, and again: no change."""
    for layer in _layers(model):
        if layer.quantization_mode and "quantized_call" not in vars(layer):
            layer.quantized_call = _one_at_a_time(layer.quantized_call)
    return model


def _layers(model):
    return [layer for layer in model._flatten_layers(include_self=False) if hasattr(layer, "quantization_mode")]


def _one_at_a_time(call):
    """``call`` (a quantized layer's) run once its float inputs exist, and run again in its backward pass once the
    gradient from above exists; as it is for other inputs (token ids: an embedding dequantizes only its rows)."""
    import tensorflow as tf

    @functools.wraps(call)
    def after_inputs(inputs, *args, **kwargs):
        if not (tf.is_tensor(inputs) and inputs.dtype.is_floating):
            return call(inputs, *args, **kwargs)

        def layer(x):
            with tf.control_dependencies([x]):  # the kernel's read and dequantization wait for x
                return call(x, *args, **kwargs)

        return tf.recompute_grad(layer)(inputs)

    return after_inputs
