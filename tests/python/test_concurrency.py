"""Two fits at the same time on one cluster with enough slots for both."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_two_concurrent_fits_do_not_collide_and_both_finish():
    out = subprocess.run([sys.executable, os.path.join(HERE, "concurrent_fits.py")],
                         capture_output=True, text=True, timeout=420, cwd=HERE)
    assert out.returncode == 0, out.stderr[-4000:]
    outcomes = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert set(outcomes) == {"a", "b"}
    for name, outcome in outcomes.items():
        assert "error" not in outcome, outcome
        assert len(outcome["workers"]) == 2 and len(outcome["loss"]) == 2
        assert outcome["workers"][0]["checksum"] == outcome["workers"][1]["checksum"]
    ports = [w["port"] for outcome in outcomes.values() for w in outcome["workers"]]
    assert len(set(ports)) == 4
