"""A model's weights as one file, in the safetensors layout (an 8-byte header length, a JSON header naming each
array's dtype, shape and byte range, then the raw values), one array per variable in the order of
``model.weights``: what the driver sends a fit's workers and the chief sends back (model_spec.py), and predict's
executors load. Written and read a variable at a time (a variable is read from TensorFlow in slices of at most
WEIGHTS_CHUNK bytes), so that no side holds a second copy of the model. Nothing here imports TensorFlow at module
import time.
"""

import json
import os
import struct

import numpy as np

from tfbarrier.errors import ModelError

FUNCTION_HINT = (
    "pass a function that builds and compiles the model instead, e.g. "
    "fit(df, lambda: build_model(), ...)"
)  # where a model cannot travel as a config and weights
WEIGHTS_CHUNK = 16 * 2**20  # bytes of a variable read from TensorFlow at a time, to write it
_SAFETENSORS_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
                       "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16",
                       "bfloat16": "BF16", "float32": "F32", "float64": "F64"}
_NUMPY_DTYPES = {code: name for name, code in _SAFETENSORS_DTYPES.items()}


def _dtype_name(variable):
    return getattr(variable.dtype, "name", variable.dtype)


def write_weights(variables, path=None):
    """Write ``variables`` (Keras 3 or tf_keras) to ``path`` as a weights file (see the module), reading
    one at a time; returns a hex digest of the file's content, its header (dtypes, shapes) and every value
    (equal on two replicas only if every value is).
    ``path`` None: the digest only. Every worker of a fit must read its variables in the same order: a
    variable synchronized on read (BatchNormalization's moving statistics) is all-reduced when read."""
    import hashlib

    variables = list(variables)
    header, offset = {"__metadata__": {"format": "tfbarrier", "order": "model.weights"}}, 0
    for i, variable in enumerate(variables):
        dtype, shape = _dtype_name(variable), [int(d) for d in variable.shape]
        if dtype not in _SAFETENSORS_DTYPES:
            raise ModelError(f"weight {getattr(variable, 'path', variable.name)} has dtype {dtype}, which tfbarrier "
                             "cannot ship: " + FUNCTION_HINT)
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[f"{i:05d}"] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writers do
    digest = hashlib.sha256(encoded)
    with open(path or os.devnull, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for variable in variables:
            for values in _values_in_slices(variable):
                values = _bytes_of(values)
                digest.update(values)
                f.write(values)
    return digest.hexdigest()


def _bytes_of(values):
    """A byte view of ``values`` (a copy only where they are not contiguous): a view, not memoryview's cast,
    which cannot name ml_dtypes' bfloat16."""
    return np.ascontiguousarray(values).reshape(-1).view(np.uint8)


def _rows_per_slice(shape, dtype):
    """Rows of its first dimension in a slice of at most WEIGHTS_CHUNK bytes of a weight of ``shape``
    and ``dtype``; None when the weight fits in one."""
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    if not shape or shape[0] * row_bytes <= WEIGHTS_CHUNK:
        return None
    return max(1, WEIGHTS_CHUNK // max(1, row_bytes))


def _values_in_slices(variable):
    """``variable``'s values as arrays of at most WEIGHTS_CHUNK bytes (rows of its first dimension), so
    that a large weight is not copied whole beside what TensorFlow's allocator already holds."""
    shape = [int(d) for d in variable.shape]
    rows = _rows_per_slice(shape, np.dtype(_dtype_name(variable)))
    if rows is None:
        yield variable.numpy()
        return
    for first in range(0, shape[0], rows):
        yield np.asarray(variable[first:first + rows])


def _read_header(f):
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return sorted(header.values(), key=lambda entry: entry["data_offsets"][0]), 8 + length


def read_weights(path, variables, writable=lambda variable: [variable]):
    """Assign the weights file at ``path`` to ``variables`` in order, a variable at a time (``_assign``);
    ``writable(variable)`` gives the tf.Variables to assign to (a distributed variable's local components)."""
    variables = list(variables)
    with open(path, "rb") as f:
        entries, start = _read_header(f)
        if len(entries) != len(variables):
            raise ModelError(f"the weights file has {len(entries)} arrays but the model has {len(variables)} "
                             "weights: the model rebuilt from its config differs from the one passed in; " + FUNCTION_HINT)
        for variable, entry in zip(variables, entries):
            shape, dtype = tuple(entry["shape"]), np.dtype(_NUMPY_DTYPES[entry["dtype"]])
            if tuple(variable.shape) != shape:
                raise ModelError(f"weight {variable.name} has shape {tuple(variable.shape)} in the rebuilt model but "
                                 f"{shape} in the model passed in; " + FUNCTION_HINT)
            f.seek(start + entry["data_offsets"][0])
            for target in writable(variable):
                _assign(target, f, shape, dtype)
                f.seek(start + entry["data_offsets"][0])


def _assign(variable, f, shape, dtype):
    """Read ``variable``'s values from ``f`` and assign them whole: one variable's values are held once more
    meanwhile. Not in slices of rows: a slice assign (ResourceStridedSliceAssign) leaves TensorFlow's variable in
    copy-on-read mode for good, in which every read of it (each step's forward pass) and every update copies all of
    it (a 323 M model of 64 MB layers peaked 735 MB higher a training process: bench/README.md)."""
    values = np.empty(shape, dtype)
    f.readinto(_bytes_of(values))
    handle = getattr(variable, "handle", None)
    if handle is None:  # not a tf.Variable (Keras 3 on another backend)
        variable.assign(values)
        return
    import tensorflow as tf

    tf.raw_ops.AssignVariableOp(resource=handle, value=values)  # ``assign`` held a third copy while it ran


def tf_variable(variable):
    """The tf.Variable holding a Keras variable's value (Keras 3 wraps one), to assign to."""
    inner = getattr(variable, "value", None)
    return inner if hasattr(inner, "assign") and hasattr(inner, "__getitem__") and not callable(inner) else variable
