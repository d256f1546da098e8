"""An R function as an ``apply`` function: R's ``spark_tf_apply()`` serialises the closure with base
``serialize()``; the training process embeds R through rpy2, unserialises it and calls it with the
partition as an R data.frame and the barrier information as an R list. rpy2 is imported only there.
"""


class RClosure:
    """A picklable wrapper of ``serialize(f, NULL)`` bytes; calling it runs ``f(df, barrier)`` in R."""

    def __init__(self, serialized):
        self.serialized = bytes(serialized)

    def __call__(self, partition, barrier):
        import rpy2.robjects as ro
        from rpy2.robjects import pandas2ri

        with (ro.default_converter + pandas2ri.converter).context():
            convert = ro.conversion.get_conversion()
            function = ro.r["unserialize"](ro.vectors.ByteVector(self.serialized))
            info = ro.vectors.ListVector({key: ro.vectors.StrVector([str(value)]) if isinstance(value, str)
                                          else ro.vectors.IntVector([value]) for key, value in barrier.items()})
            result = function(convert.py2rpy(partition), info)
            frame = convert.rpy2py(result)
        if not hasattr(frame, "columns"):
            raise TypeError("the R function must return a data.frame")
        return frame
