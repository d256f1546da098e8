"""Text out: a causal LM's continuations of a DataFrame's prompt column, generated on the executors
(``predict(output="text")``).

The model travels and loads as predict's does (scoring_models.py: once per Python worker). Each task compiles it
with the sampler asked for (KerasHub's ``compile(sampler=)``) and calls the model's own ``generate`` on
``batch_size`` prompts at a time, so a partition streams through in bounded memory. A prompt that leaves no room
to generate (it fills ``max_length`` tokens: the preprocessor would cut it without a word) fails its task naming
the row; everything that does not depend on the rows is checked on the driver, before any Spark job. The prompts'
lengths are not: predict is a lazy transformation, and a prompt's tokens are counted only by the preprocessor, so
a driver's refusal would run a Spark job over the column at the call and tokenize there what the tasks tokenize.
"""

import dataclasses

import numpy as np
import pyarrow as pa

from tfbarrier import checks
from tfbarrier.errors import ColumnError, InvalidArgumentError, ModelError
from tfbarrier.predicting.scoring_models import load


@dataclasses.dataclass(frozen=True)
class Generation:
    """How to generate: up to ``max_length`` tokens a row (prompt included), with the KerasHub sampler whose
    serialized config is ``sampler``, keeping the prompt in the output unless ``strip_prompt``."""

    max_length: int
    sampler: dict
    strip_prompt: bool = False


def _is_causal_lm(model):
    try:
        from keras_hub.models import CausalLM
    except ImportError:
        return False
    return isinstance(model, CausalLM)


def settings(model, layout, max_length=None, sampler="greedy", strip_prompt=False):
    """The Generation for ``model`` over ``layout``'s prompt column, refused on the driver, in words, where the
    model cannot generate or an argument is wrong."""
    if not _is_causal_lm(model):
        raise ModelError(f"output='text' generates with a KerasHub causal LM (e.g. keras_hub.models.GPT2CausalLM); "
                         f"got a {type(model).__name__}: for its scores, use output='class', 'probabilities' or 'raw'")
    if getattr(model, "preprocessor", None) is None:
        raise ModelError(f"output='text' needs the causal LM's preprocessor, which reads the prompts and writes the "
                         f"text; this {type(model).__name__} has none: give it one (e.g. from_preset's)")
    if not layout.takes_text:
        raise ColumnError(f"output='text' needs one string column of prompts as features; got {layout.features}")
    sequence_length = getattr(model.preprocessor, "sequence_length", None)
    max_length = sequence_length if max_length is None else checks.positive_int("max_length", max_length)
    positions = getattr(model.backbone, "max_sequence_length", None)
    if max_length is None:
        raise InvalidArgumentError("the model's preprocessor has no sequence_length: give max_length")
    if positions is not None and max_length > positions:
        raise InvalidArgumentError(f"max_length={max_length} is more than the model's {positions} positions "
                                   f"(its backbone's max_sequence_length): give at most {positions}")
    return Generation(max_length, _sampler_config(sampler), bool(strip_prompt))


def _sampler_config(sampler):
    """The sampler (a KerasHub sampler's name, e.g. "greedy" or "top_k", or a Sampler object, seeded for
    sampling that can be repeated) as the config the executors rebuild it from."""
    from keras_hub import samplers

    try:
        made = samplers.get(sampler)
    except (KeyError, ValueError, TypeError):
        made = None
    if not isinstance(made, samplers.Sampler):  # an unknown name comes back as it was
        raise InvalidArgumentError(f"sampler must be a KerasHub sampler or its name (\"greedy\", \"top_k\", "
                                   f"\"top_p\", \"random\", \"beam\", \"contrastive\"); got {sampler!r}")
    return samplers.serialize(made)


def _check_room(model, batch, max_length, offset):
    """Fail the task when a prompt of ``batch`` fills ``max_length`` tokens: nothing would be generated, and the
    preprocessor would have cut a longer one."""
    packed = model.preprocessor.generate_preprocess(batch, sequence_length=max_length)
    full = np.flatnonzero(np.asarray(packed["padding_mask"]).all(axis=1))
    if len(full):
        row = int(full[0])
        raise ColumnError(f"row {offset + row} of the partition: its prompt fills all {max_length} tokens of "
                          "max_length, so nothing would be generated (and a longer one would be cut): raise "
                          "max_length, up to the model's positions, or shorten the prompts")


def _with_sampler(model, config):
    """``model`` compiled with the sampler of ``config``. Compiling drops the model's traced generate function, so
    a task whose worker's copy has that sampler already keeps it; a seeded sampler is made afresh in every task,
    so that a partition's sampling repeats whatever the worker ran before."""
    from keras_hub import samplers

    current = getattr(model, "sampler", None)
    if current is None or samplers.serialize(current) != config or config["config"].get("seed") is not None:
        model.compile(sampler=samplers.deserialize(config))
    return model


def generator(scoring, layout, generation, batch_size):
    """A function of one partition's Arrow record batches of the prompt column to its generated texts, one
    Arrow string array per batch."""

    def generate(batches):
        model = None
        offset = 0  # rows of this partition done so far
        for batch in batches:
            if model is None:
                model = _with_sampler(load(scoring), generation.sampler)  # the worker's cached copy
            texts = layout.x(batch).to_pylist()  # a null fails the task (features.value_column)
            out = []
            for start in range(0, len(texts), batch_size):
                chunk = texts[start:start + batch_size]
                _check_room(model, chunk, generation.max_length, offset + start)
                out.extend(model.generate(chunk, max_length=generation.max_length,
                                          strip_prompt=generation.strip_prompt))
            offset += len(batch)
            yield pa.array(out, pa.string())

    return generate
