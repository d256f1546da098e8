"""The feature layout of a model of several inputs: one column per model input (``features={input: column}``),
each a numeric column, an array column of numbers or a Spark ML vector column (features.py has the others)."""

import dataclasses
import math

import pyarrow as pa
import pyarrow.compute as pc

from tfbarrier.data.features import Features, array_aggregates, vector_to_array
from tfbarrier.errors import ColumnError, ModelError


@dataclasses.dataclass(frozen=True)
class NamedInputs(Features):
    """One column per model input (``features={input name: column}``, ``inputs`` the names): a numeric
    column (one value a row), an array column of numbers or a Spark ML vector column (``arrays``, of one
    length in every row; ``vectors`` among them). The shard's x is a struct of one field per input, and
    integer columns and arrays of integers stay integers (stored_forms.IntRows, NamedRows)."""

    arrays: tuple = ()
    vectors: tuple = ()

    def feature_projection(self, spark):
        from pyspark.sql import functions as F

        return [vector_to_array(spark, name).alias(name) if name in self.vectors else F.col(name)
                for name in dict.fromkeys(self.features)]

    def projection(self, spark):
        from pyspark.sql import functions as F

        rest = [name for name in dict.fromkeys(self.columns) if name not in self.features]
        return [*self.feature_projection(spark), *(F.col(name) for name in rest)]

    def aggregates(self):
        return array_aggregates(self.arrays, lambda what, i: f"{what}_{i}")

    def check_profile(self, profile, input_shape):
        for i, name in enumerate(self.arrays):
            if profile[f"null_elements_{i}"]:
                raise ColumnError(f"feature column {name!r} has {profile[f'null_elements_{i}']} array(s) with null "
                                  "elements: impute them first")
            self.check_widths(profile[f"min_length_{i}"], profile[f"max_length_{i}"], name)
        self.check_input(input_shape, self.widths(profile))

    def widths(self, profile):
        found = {name: profile[f"min_length_{i}"] for i, name in enumerate(self.arrays)}
        return {name: found.get(column, 1) for name, column in zip(self.inputs, self.features)}

    def check_input(self, input_shape, width=None):
        """Refuse a model whose inputs are not the ones named (``input_shape``: {name: shape}, one shape for
        a model of one input, None when unknown) or that rows of ``width`` ({input: values a row}) cannot fill."""
        if input_shape is None:
            return
        shapes = input_shape if isinstance(input_shape, dict) else (
            {self.inputs[0]: input_shape} if len(self.inputs) == 1 else None)
        if shapes is None or set(shapes) != set(self.inputs):
            names = sorted(shapes) if shapes is not None else "one unnamed input"
            raise ModelError(f"features= names the inputs {sorted(self.inputs)}, but the model's inputs are {names}: "
                             "give one column per model input, keyed by the input's name (keras.Input(name=...))")
        for name, column in zip(self.inputs, self.features):
            if width is not None and width.get(name) is not None and None not in shapes[name]:
                if width[name] != math.prod(shapes[name]):
                    raise ModelError(f"feature column {column!r} has {width[name]} value(s) a row but the model's "
                                     f"input {name!r} of shape {tuple(shapes[name])} needs {math.prod(shapes[name])}: "
                                     "choose the matching column or change the model's input")

    def empty_x_type(self):
        return pa.struct([(name, pa.list_(pa.float32(), 1)) for name in self.inputs])

    def x(self, batch):
        """A struct of one FixedSizeListArray per input: int64 for integers, else float32."""
        fields = []
        for name in self.features:
            column = batch.column(name)
            if column.null_count:
                raise ColumnError(f"feature column {name!r} has null values: drop or impute them first")
            width = 1
            if name in self.arrays:
                column, width = self.flat_values(column, name)
            dtype = pa.int64() if pa.types.is_integer(column.type) else pa.float32()
            fields.append(pa.FixedSizeListArray.from_arrays(pc.cast(column, dtype), width))
        return pa.StructArray.from_arrays(fields, list(self.inputs))
