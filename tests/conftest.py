"""Shared pytest set-up.

Under CI=true a skipped test that carries a required marker (`slurm`, `sglang`, `sglang_server`, `router_binary`,
`live_heavy`) FAILS the run:
CI must prepare the Slurm cluster and the CPU SGLang environment, so it cannot go green by
silently not testing them. Skips of other tests, and xfails, are untouched.
"""

from __future__ import annotations

import os

import pytest

# Markers whose tests must not be skipped when CI=true.
REQUIRED_UNDER_CI: tuple[str, ...] = ("slurm", "sglang", "sglang_server", "router_binary", "live_heavy")


def ci_enabled() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


def fail_required_skips_under_ci(item: pytest.Item, report: pytest.TestReport, markers) -> None:
    """Turn the skip of a test carrying one of `markers` into a failure when CI=true (xfail untouched)."""
    if not (report.skipped and ci_enabled()) or hasattr(report, "wasxfail"):
        return
    hit = [m for m in markers if item.get_closest_marker(m) is not None]
    if not hit:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = f"CI=true: a test marked {hit[0]!r} must run, but it was skipped: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fail_required_skips_under_ci(item, outcome.get_result(), REQUIRED_UNDER_CI)
