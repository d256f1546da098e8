"""What the training loop (training_loop.py) does its own way for each Keras: ``Keras3`` for a Keras 3 model that
trains natively (models/native_model.py), ``TfKeras`` for a tf_keras model (a model object's, a model function's,
a Keras 3 model translated). ``flavor_of`` picks one by the model a worker built. Imported only in training
processes.

``collective`` below is the exchange's (exchange/base.py, ``WorkerSide.collective``): the ring's sums and
gathers, or None under a strategy, which sums inside Keras.
"""

import math

import numpy as np
import tf_keras

from tfbarrier.errors import ModelError
from tfbarrier.fitting import evaluation, optimizers, pacing, training
from tfbarrier.fitting.ring_checkpoints import fit_plan
from tfbarrier.models.model_spec import keras_flavor
from tfbarrier.models.native_model import input_shape_of
from tfbarrier.models.weights_file import write_weights


def flavor_of(model):
    """The flavor of the Keras ``model`` was built in (a model function's may be either)."""
    return Keras3() if keras_flavor(model) == "keras3" else TfKeras()


class Keras3:
    """A Keras 3 model (native_model.NativeModel): only tfbarrier's ring trains it."""

    def __init__(self):
        import keras

        self.keras = keras
        self.metrics_reader = "_get_metrics_result_or_logs"  # what Keras 3's fit reads an epoch's results with

    def prepared(self, model, distribution, variables):
        """``model`` (built by its spec) ready to train: its optimizer's slots made for ``variables`` (those whose
        state this worker holds: every trainable one unless the exchange shards it), its updates fused."""
        if model.optimizer.built and len(variables) < len(model.trainable_variables):
            if int(model.optimizer.iterations.numpy()):
                raise ModelError("communication={'shard': 'optimizer'} cannot shard an optimizer that has stepped "
                                 "already (a model saved with its optimizer's state): compile the model again, or "
                                 "drop the shard")
            # built by Keras's load with slots for every weight, all still zero: made again for this worker's
            model.optimizer = type(model.optimizer).from_config(model.optimizer.get_config())
        if not model.optimizer.built:  # its slots now, for a checkpoint to restore into
            model.optimizer.build(variables)
        optimizers.fuse_keras3_updates(model.optimizer)
        return model

    def input_shape(self, job, model):
        return job.model.input_shape if job.model.input_shape is not None else input_shape_of(model)

    def steps_per_execution(self, model):
        return int(model.steps_per_execution)

    def plan(self, resume, epochs, steps_per_epoch):
        return fit_plan(resume, epochs, steps_per_epoch)

    def pace(self, model, job, plan, collective):
        """Set the steps per call: Keras 3 runs whole calls, so they must divide every fit's epoch of the
        ``plan``, or an epoch would run past its end; fit's number, else as compiled ("auto" has no pacer
        here yet). The same on every worker: the ring's exchanges follow the calls. Returns None."""
        wanted = job.steps_per_execution if isinstance(job.steps_per_execution, int) else model.steps_per_execution
        steps = math.gcd(*[fit[2] for fit in plan])
        model.steps_per_execution = max(d for d in range(1, min(int(wanted), steps) + 1) if steps % d == 0)

    def validation(self, dataset, steps, collective, every):
        return evaluation.Keras3Validation(dataset, steps, collective, every)

    def wrap_step(self, optimizer, step):
        """Make ``optimizer``'s update ``step(apply, grads, variables)``, where ``apply(grads, variables)`` is its
        own (``variables`` None: every one it updates)."""
        apply = optimizer.apply

        def apply_step(grads, trainable_variables=None):
            return step(apply, list(grads), trainable_variables)

        optimizer.apply = apply_step  # what apply_gradients calls, on this instance only

    def write_trained(self, job, model, workdir, is_chief):
        """(the chief's ``.keras`` archive for the driver, the weights' checksum); with adapters, which no
        archive keeps, its weights file."""
        if hasattr(job.model, "write_trained"):  # a preset's: its adapters alone, where it has them
            return (job.model.write_trained(model, workdir) if is_chief else {}), write_weights(model.weights)
        if getattr(job.model, "adapters", ()):
            return training.write_trained(job, model, workdir, is_chief)
        return training.write_archive(model, workdir, is_chief)


class TfKeras(Keras3):
    """A tf_keras model (model_spec.ModelSpec: a tf_keras model, a model function's, a Keras 3 model translated),
    under a strategy (its ``distribution``) or over the ring."""

    def __init__(self):
        self.keras = tf_keras
        self.metrics_reader = "_validate_and_get_metrics_result"  # tf_keras's fit's, at an epoch's end

    def prepared(self, model, distribution, variables):
        optimizers.build(model, distribution, variables)
        optimizers.fuse_updates(model)
        return model

    def input_shape(self, job, model):
        return tuple(model.input_shape[1:])

    def steps_per_execution(self, model):
        return int(model.steps_per_execution.numpy())

    def plan(self, resume, epochs, steps_per_epoch):
        """One fit: tf_keras's starts mid-epoch itself (the checkpoints' callback is its ``_training_state``),
        so the resumed epoch's steps keep their numbers."""
        return [(0, epochs, steps_per_epoch, resume["steps_done"] if resume else 0)]

    def pace(self, model, job, plan, collective):
        """Set the steps per call (pacing.py: tf_keras cuts an epoch's last call short), the workers' timings
        gathered over the ring where there is one; the pacer for "auto", or None."""
        gather = collective and (lambda value: collective.all_gather(np.array(value, np.float64)).tolist())
        return pacing.resolve(model, job.steps_per_execution, most=training.steps_between_checkpoints(job),
                              gather=gather or None)

    def validation(self, dataset, steps, collective, every):
        return evaluation.Validation(dataset, steps, every, collective)

    def wrap_step(self, optimizer, step):
        apply_gradients = optimizer.apply_gradients

        def apply_step(grads_and_vars, *args, **kwargs):
            grads, variables = zip(*grads_and_vars)
            return step(lambda grads, variables: apply_gradients(list(zip(grads, variables)), *args, **kwargs),
                        list(grads), variables)

        optimizer.apply_gradients = apply_step  # what minimize() calls, on this instance only

    def write_trained(self, job, model, workdir, is_chief):
        return training.write_trained(job, model, workdir, is_chief)
