"""The exchange is chosen once per fit (tfbarrier.exchange): fit's ``exchange=`` names it, "auto" picks
tfbarrier's ring but for workers of several GPUs each on a cluster that does not encrypt, the choice is
checked against the model, the workers' GPUs and the options, and the spellings from before ``exchange=``
still work with a FutureWarning naming the new one. Eight workers on local[8] train one model, as one process
does on the same global batches."""

import warnings

import numpy as np
import pytest
from conftest import digits_cnn, run_driver

import tfbarrier
from tfbarrier import exchange as exchanges
from tfbarrier.errors import InvalidArgumentError


@pytest.mark.parametrize("gpus, encrypted, native, chosen", [
    (0, False, False, "tfbarrier"), (1, False, False, "tfbarrier"),
    (2, False, False, "strategy"),  # local replicas, on a network that need not be encrypted
    (1, True, False, "tfbarrier"), (0, False, True, "tfbarrier"),
])
def test_auto_is_the_ring_but_for_several_gpus_a_worker_in_the_clear(gpus, encrypted, native, chosen):
    exchange = exchanges.choose("auto", {}, native=native, encrypted=encrypted, gpus_per_worker=gpus)
    assert exchange.name == chosen


@pytest.mark.parametrize("exchange, communication, native, gpus, message", [
    ("tfbarrier", {}, False, 2, "exchange='tfbarrier' trains one copy of the model per worker"),
    ("auto", {}, False, 2, None),
    ("auto", {}, True, 2, "exchange='tfbarrier' trains one copy of the model per worker"),
    ("strategy", {}, True, 0, "trains over tfbarrier's ring only: drop exchange='strategy'"),
    ("tfbarrier", {"implementation": "ring"}, False, 0, "not an option of exchange='tfbarrier'"),
    ("strategy", {"implementation": "nccl", "bytes_per_pack": 0}, False, 2, None),
    ("ring", {}, False, 0, "exchange must be one of ['auto', 'tfbarrier', 'strategy'], got 'ring'"),
])
def test_a_choice_that_cannot_work_is_refused_in_words(exchange, communication, native, gpus, message):
    if message is None:
        assert exchanges.choose(exchange, communication, native=native, encrypted=False, gpus_per_worker=gpus)
        return
    with pytest.raises(InvalidArgumentError, match=message.replace("[", r"\[").replace("(", r"\(")):
        exchanges.choose(exchange, communication, native=native, encrypted=False, gpus_per_worker=gpus)


@pytest.mark.parametrize("old, new, warned", [
    ({"implementation": "tfbarrier"}, ("tfbarrier", {}), "use exchange='tfbarrier'"),
    ({"implementation": "ring", "bytes_per_pack": 0}, ("strategy", {"implementation": "ring", "bytes_per_pack": 0}),
     "use exchange='strategy', communication={'implementation': 'ring'}"),
    ({"implementation": "nccl"}, ("strategy", {"implementation": "nccl"}), "exchange='strategy'"),
    ({"implementation": "auto"}, ("auto", {}), None),  # what auto meant then, the default: no warning
    ({"compression": "fp16"}, ("auto", {"compression": "fp16"}), None),
])
def test_old_spellings_map_to_the_exchange_they_meant_with_a_warning(old, new, warned):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert exchanges.requested("auto", old) == new
    said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert said == ([] if warned is None else [said[0]]) and (warned is None or warned in said[0]), said


def test_every_registered_exchange_answers_for_itself():
    for name, exchange in exchanges.EXCHANGES.items():
        assert exchange.name == name and exchange.step_copies > 0
        assert type(exchange).join is not exchanges.Exchange.join, f"{name} has no side in a training process"
        assert exchange.describe({"bytes_per_pack": 1})["bytes_per_pack"] == 1


@pytest.mark.parametrize("communication, implementation", [
    ({"implementation": "tfbarrier"}, "tfbarrier ring"), ({"implementation": "ring"}, "ring")])
def test_a_fit_with_an_old_spelling_still_trains_as_it_did_and_says_the_new_one(digits_df, communication,
                                                                                 implementation):
    with pytest.warns(FutureWarning, match="use exchange='"):
        result = tfbarrier.fit(digits_df, digits_cnn(), features="pixels", label="digit", batch_size=64,
                               steps_per_epoch=2, num_workers=2, verbose=0, communication=communication)
    assert {w["communication"]["implementation"] for w in result.workers} == \
        {"tfbarrier ring (authenticated)" if implementation == "tfbarrier ring" else implementation}


@pytest.fixture(scope="module")
def many_workers():
    return run_driver("eight_workers.py", timeout=600)


@pytest.mark.parametrize("fit, workers", [("eight", 8), ("four_sharded", 4)])
def test_eight_workers_and_four_holding_a_quarter_of_adams_state_each_train_as_one_process_does(many_workers, fit,
                                                                                                 workers):
    outcome = many_workers[fit]
    assert len(outcome["checksums"]) == workers and len(set(outcome["checksums"])) == 1
    np.testing.assert_allclose(outcome["loss"], outcome["reference_loss"], rtol=1e-4)
    assert outcome["loss"][-1] < outcome["loss"][0]
    for trained, expected in zip(outcome["weights"], outcome["reference_weights"]):
        np.testing.assert_allclose(trained, expected, rtol=1e-4, atol=1e-6)
    if fit == "four_sharded":  # each worker its share of the state: together every weight once
        held = outcome["state_of_weights"]
        assert sum(held) == outcome["parameters"] and 0 < min(held), held
        # about a quarter each, though one matrix is 2/3 of the weights: cut into a block of rows per worker
        assert max(held) <= 0.3 * outcome["parameters"], held
