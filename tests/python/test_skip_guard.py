"""The skip guard (support/skip_guard.py), run as CI runs it: pytest, with the guard's hooks, over a
test file that skips. Under CI=true an unexpected skip fails the run and the allowed one does not;
without CI=true nothing fails."""

import os
import subprocess
import sys

import pytest

from support.skip_guard import ALLOWED_CI_SKIP

HERE = os.path.dirname(os.path.abspath(__file__))


def run_pytest(tmp_path, reason, ci):
    (tmp_path / "conftest.py").write_text("from support.skip_guard import pytest_runtest_logreport, "
                                          "pytest_sessionfinish  # noqa: F401\n")
    (tmp_path / "test_skipping.py").write_text(
        f"import pytest\n\ndef test_passes():\n    assert True\n\n"
        f"def test_skips():\n    pytest.skip({reason!r})\n")
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p), **ci)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=120)
    return out.returncode, out.stdout


@pytest.mark.parametrize("reason, ci, code, says", [
    ("pyspark[connect] extras are not installed", {"CI": "true"}, 1, "CI: unexpected skip of"),
    (f"{ALLOWED_CI_SKIP}: Operation not permitted", {"CI": "true"}, 0, "CI: 1 test(s) skipped because"),
    ("pyspark[connect] extras are not installed", {}, 0, "1 passed, 1 skipped"),
], ids=["unexpected_under_ci", "allowed_under_ci", "any_without_ci"])
def test_an_unexpected_skip_fails_a_ci_run_and_the_allowed_one_does_not(tmp_path, reason, ci, code, says):
    returncode, out = run_pytest(tmp_path, reason, ci)
    assert returncode == code, out
    assert says in out, out


def test_ci_runs_the_suite_with_the_guard_on():
    with open(os.path.join(HERE, "..", "..", ".ci", "run")) as f:
        assert "export CI=true" in f.read().splitlines()
