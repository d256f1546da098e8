"""Fits at the same time on one cluster with enough slots for them: two fits from two threads, tune's
2-worker trials two at a time, and a tune stopped by Ctrl-C (one local[4] driver program runs all three)."""

import pytest
from conftest import run_driver


@pytest.fixture(scope="module")
def outcomes():
    return run_driver("concurrent_fits.py", timeout=900)


def training_span(outcome):
    """(first step, end) of a fit's training: its first worker's first step to its last worker's end, by
    their training processes' clocks (time.time() on this one machine)."""
    return min(w["first_step_at"] for w in outcome["workers"]), max(w["finished_at"] for w in outcome["workers"])


def test_two_concurrent_fits_do_not_collide_and_both_finish(outcomes):
    fits = {name: outcomes[name] for name in ("a", "b")}
    for name, outcome in fits.items():
        assert "error" not in outcome, outcome
        assert len(outcome["workers"]) == 2 and len(outcome["loss"]) == 2
        assert outcome["workers"][0]["checksum"] == outcome["workers"][1]["checksum"]
    ports = [w["port"] for outcome in fits.values() for w in outcome["workers"]]
    assert len(set(ports)) == 4
    # They ran at once: each one's training had begun before the other's ended (each chief waited at its
    # end for the other's, conftest.meet_in_pairs)
    (a_began, a_ended), (b_began, b_ended) = training_span(fits["a"]), training_span(fits["b"])
    assert max(a_began, b_began) < min(a_ended, b_ended), {"a": (a_began, a_ended), "b": (b_began, b_ended)}


def test_tune_trains_two_trials_of_two_workers_at_once_on_four_slots(outcomes):
    # Each of the first two trials' chiefs waited for the other's at the end of training (conftest.
    # meet_in_pairs): trials run one after another would have failed.
    search = outcomes["tune"]
    assert search.get("status") == ["ok"] * 3, search
    assert search["workers"] == [2]


def test_ctrl_c_stops_a_tune_and_leaves_no_job_or_process(outcomes):
    interrupted = outcomes["interrupted"]
    assert interrupted.get("raised") == "KeyboardInterrupt", interrupted
    assert interrupted["processes_left"] == [] and interrupted["active_jobs"] == []
