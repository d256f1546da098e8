"""Which value of a metric is the better one: the mode of ``save_best`` (saving.py) and of tune's ranking
(tuning.py). Plain Python: the driver's checks use it too."""

from tfbarrier.errors import InvalidArgumentError

HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall")  # in a metric's name: "auto" mode maximises it


def best_mode(monitor, mode, argument="save_mode"):
    """"min" or "max": ``mode`` itself, or for "auto" "max" when the metric's name has one of
    HIGHER_IS_BETTER (as Keras's ModelCheckpoint decides for accuracies), else "min"."""
    if mode not in ("auto", "min", "max"):
        raise InvalidArgumentError(f"{argument} must be 'auto', 'min' or 'max', got {mode!r}")
    if mode != "auto":
        return mode
    return "max" if any(word in monitor for word in HIGHER_IS_BETTER) else "min"


def better(mode):
    """A function telling whether a metric's value improves on another in ``mode`` ("min" or "max")."""
    return (lambda a, b: a < b) if mode == "min" else (lambda a, b: a > b)
