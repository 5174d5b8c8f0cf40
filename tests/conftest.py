"""Shared pytest options: `--update-golden` rewrites tests/golden/; under CI=true a skipped test is a failure."""

import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/ from the current output")


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """CI installs every renderer and package the tests use, so nothing may be skipped there."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped under CI: {report.longrepr}"
