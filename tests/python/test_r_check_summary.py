"""tests/r-check-summary.sh, which decides whether `make test-r` passes: R CMD check's own exit code
says nothing about skipped tests or a test run that did not finish."""

import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "r-check-summary.sh")
# Excerpts of a real R CMD check whose tests failed (00check.log with R's "ERROR" on a line of its own,
# and testthat.Rout.fail), from this project's own check.
FAILED_CHECK = os.path.join(HERE, "support", "r-check-failed")
CHECK_LOG = "* checking tests ... OK\n* checking re-building of vignette outputs ... OK\nStatus: OK\n"


def summary(tmp_path, rout, log=CHECK_LOG):
    check = tmp_path / "tfbarrier.Rcheck"
    (check / "tests").mkdir(parents=True)
    (check / "00check.log").write_text(log)
    if rout is not None:
        (check / "tests" / "testthat.Rout").write_text(rout)
    out = subprocess.run(["sh", SCRIPT, str(check)], capture_output=True, text=True)
    return out.returncode, out.stdout


def rout(skips=(), counts="[ FAIL 0 | WARN 0 | SKIP {n} | PASS 53 ]"):
    line = counts.format(n=sum(n for _, n in skips))
    listed = "".join(f"• {reason} ({n})\n" for reason, n in skips)
    return f"> test_check('tfbarrier')\n{line}\n\n══ Skipped tests ══════\n{listed}\n{line}\n> proc.time()\n"


def test_only_the_sparklyr_skips_pass(tmp_path):
    code, out = summary(tmp_path, rout([("sparklyr cannot be loaded", 1), ("pysparklyr cannot be loaded", 1)]))
    assert code == 0 and "testthat: 53 passed, 0 failed, 2 skipped" in out


@pytest.mark.parametrize("reason", ["the Python side of tfbarrier (and Java) is not available",
                                    "rpy2 is not installed in tfbarrier's Python"])
def test_any_other_skip_fails_the_run(tmp_path, reason):
    code, out = summary(tmp_path, rout([("sparklyr cannot be loaded", 1), (reason, 9)]))
    assert code == 1 and f"{reason} (9)" in out and "must run here" in out


def test_a_missing_summary_line_or_output_fails_the_run(tmp_path):
    code, out = summary(tmp_path / "cut", "> test_check('tfbarrier')\nKilled\n")
    assert code == 1 and "did not finish" in out
    code, out = summary(tmp_path / "none", None)
    assert code == 1 and "did not run" in out


def test_a_check_warning_fails_the_run(tmp_path):
    code, out = summary(tmp_path, rout(), log=CHECK_LOG + "* checking Rd files ... WARNING\n")
    assert code == 1 and "ERROR/WARNING" in out


def test_a_real_failed_check_fails_and_names_the_test(tmp_path):
    import shutil

    check = shutil.copytree(FAILED_CHECK, tmp_path / "tfbarrier.Rcheck")
    out = subprocess.run(["sh", SCRIPT, str(check)], capture_output=True, text=True)
    assert out.returncode == 1
    assert "testthat: 95 passed, 1 failed, 2 skipped" in out.stdout
    assert "Failure ('test-fit.R:141'): spark_tf_fit checkpoints every few steps" in out.stdout


def test_a_failed_test_fails_the_run_whatever_the_check_log_says(tmp_path):
    code, out = summary(tmp_path, rout(counts="[ FAIL 2 | WARN 0 | SKIP {n} | PASS 53 ]"))
    assert code == 1 and "2 R test(s) failed" in out
