"""tfbarrier: train TensorFlow/Keras models across a Spark cluster with one call.

    result = tfbarrier.fit(df, model, features="pixels", label="digit", epochs=3, batch_size=64, num_workers=2)

Importing tfbarrier does not import TensorFlow: executors and R sessions pay for it only in the
training processes.
"""

from . import errors, r_closure, tf_banners  # r_closure: what R's spark_tf_apply() sends (core$r_closure)
from .api import FitResult, apply, fit, run
from .attach import attach, attached_session, detach
from .environment import PythonEnv
from .frames import spark_frame
from .inference import predict, predict_local
from .tuning import TuneResult, tune

tf_banners.install()

__version__ = "0.1.0"
__all__ = ["FitResult", "PythonEnv", "TuneResult", "apply", "attach", "attached_session", "detach", "errors", "fit",
           "predict", "predict_local", "run", "spark_frame", "tune", "__version__"]
