"""Two fits at the same time on one cluster with enough slots for both."""

from conftest import run_driver


def test_two_concurrent_fits_do_not_collide_and_both_finish():
    outcomes = run_driver("concurrent_fits.py")
    assert set(outcomes) == {"a", "b"}
    for name, outcome in outcomes.items():
        assert "error" not in outcome, outcome
        assert len(outcome["workers"]) == 2 and len(outcome["loss"]) == 2
        assert outcome["workers"][0]["checksum"] == outcome["workers"][1]["checksum"]
    ports = [w["port"] for outcome in outcomes.values() for w in outcome["workers"]]
    assert len(set(ports)) == 4
