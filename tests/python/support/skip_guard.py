"""The tests' skip guard, a pytest plugin (conftest.py imports its hooks): under ``CI=true`` (``.ci/run``
sets it), a test skipped for any reason but ALLOWED_CI_SKIP fails the run, so that a CI machine missing
something a test needs does not pass by skipping it. test_skip_guard.py runs pytest with it."""

import os

import pytest

# The one reason a test may skip under CI=true: the machine cannot make network namespaces (not root, no
# CAP_NET_ADMIN), which only the multi-host tests need. Tools the Makefile installs being missing is not one.
ALLOWED_CI_SKIP = "cannot make a network namespace"
_skips = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skips.append((report.nodeid, reason.removeprefix("Skipped: ")))


def pytest_sessionfinish(session, exitstatus):
    """Under CI=true, a skip for any other reason than ALLOWED_CI_SKIP fails the run (a CI without the
    multi-host tests would pass silently); the allowed ones are named in the log."""
    if os.environ.get("CI") != "true" or hasattr(session.config, "workerinput"):
        return
    allowed = [(node, why) for node, why in _skips if why.startswith(ALLOWED_CI_SKIP)]
    unexpected = [(node, why) for node, why in _skips if not why.startswith(ALLOWED_CI_SKIP)]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter and (allowed or unexpected):
        reporter.ensure_newline()
    if allowed and reporter:
        reporter.write_line(f"CI: {len(allowed)} test(s) skipped because this machine {allowed[0][1]}")
    if unexpected:
        if reporter:
            for node, why in unexpected:
                reporter.write_line(f"CI: unexpected skip of {node}: {why}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
