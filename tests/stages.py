"""The suite's stages: in which order tests run, and how long each stage took (a pytest plugin of the
root conftest).

Order: the quick tests (unit and integration) first, while the session's stack comes up in the
background (:mod:`tests.shared_stack`); then the browser tests, the e2e tests, the chaos drills, and
last the tests marked ``last`` (they stop the shared stack). Within a stage, the collection order.

At the end the run prints the wall time of each stage, with the stages ``scripts/test`` timed before
pytest started (setup, lint, types: ``BATON_TEST_STAGES``, a file of ``name seconds`` lines, and
``BATON_TEST_T0``, the run's start in epoch seconds), and warns when the whole run took longer than
``BATON_TEST_BUDGET_MIN`` minutes (45): CI allows 90, and every new e2e test takes from the difference.
The table is written to ``var/test-stages.json`` too, with each module's time (the setup, call and
teardown of its tests: a module's first setup carries the fixtures it starts, its last teardown the ones
it stops) and the run's provenance; ``scripts/test-durations`` renders it as the table of
``docs/testing.md``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("quick", "browser", "e2e", "chaos", "last")
BUDGET_MIN = float(os.environ.get("BATON_TEST_BUDGET_MIN", "45"))
_load_at_start = os.getloadavg()[0]  # the machine's load as pytest started (provenance)


def stage_of(item: pytest.Item) -> str:
    for name in ("last", "chaos", "e2e", "browser"):
        if item.get_closest_marker(name) is not None:
            return name
    return "quick"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "last: runs after every other test (it stops the session's shared stack)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(ORDER)}
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (rank[stage_of(item)], order[id(item)]))


class _Clock:
    def __init__(self) -> None:
        self.spans: dict[str, list[float]] = {}
        self.t_pytest = time.time()
        # module -> {"stage", "tests", "setup", "call", "teardown", "slowest_setup": [test, s]}
        self.modules: dict[str, dict] = {}
        self.outcomes: dict[str, int] = {}

    def seen(self, stage: str, start: float, end: float) -> None:
        span = self.spans.setdefault(stage, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)


_clock = _Clock()


def pytest_sessionstart(session: pytest.Session) -> None:
    _clock.t_pytest = time.time()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    start = time.time()
    yield
    _clock.seen(stage_of(item), start, time.time())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    row = _clock.modules.setdefault(module, {"stage": "", "tests": 0, "setup": 0.0, "call": 0.0,
                                             "teardown": 0.0, "slowest_setup": ["", 0.0]})
    row[report.when] += report.duration
    if report.when == "setup":
        row["tests"] += 1
        if report.duration > row["slowest_setup"][1]:
            row["slowest_setup"] = [report.nodeid.split("::", 1)[-1], report.duration]
    if report.when == "call" or report.outcome != "passed":
        _clock.outcomes[report.outcome] = _clock.outcomes.get(report.outcome, 0) + 1


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        module = item.nodeid.split("::", 1)[0]
        _clock.modules.setdefault(module, {"stage": "", "tests": 0, "setup": 0.0, "call": 0.0, "teardown": 0.0,
                                           "slowest_setup": ["", 0.0]})["stage"] = stage_of(item)


def _provenance() -> dict[str, object]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "command": " ".join(["pytest", *sys.argv[1:]]), "machine": platform.node(),
            "cpus": os.cpu_count(), "load_1m_at_start": _load_at_start}


def _before_pytest() -> list[tuple[str, float]]:
    path = os.environ.get("BATON_TEST_STAGES")
    rows: list[tuple[str, float]] = []
    if path and Path(path).exists():
        for line in Path(path).read_text().splitlines():
            name, _, seconds = line.partition(" ")
            try:
                rows.append((name, float(seconds)))
            except ValueError:
                continue
    return rows


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    now = time.time()
    rows = _before_pytest()
    # the pytest stages, each from its first test's start to its last test's end; what lies between
    # (collection, session fixtures' teardown) is the rest of pytest's time
    staged = [(name, _clock.spans[name][1] - _clock.spans[name][0]) for name in ORDER if name in _clock.spans]
    pytest_s = now - _clock.t_pytest
    rows += [*staged, ("pytest other", max(0.0, pytest_s - sum(s for _, s in staged)))]
    t0 = float(os.environ.get("BATON_TEST_T0") or _clock.t_pytest)
    total = now - t0
    tr = terminalreporter
    tr.section("wall time per stage")
    for name, seconds in rows:
        tr.write_line(f"{name:<14} {seconds / 60:6.1f} min  ({seconds:7.0f} s)")
    tr.write_line(f"{'total':<14} {total / 60:6.1f} min  ({total:7.0f} s)")
    if total > BUDGET_MIN * 60:
        tr.write_line(f"WARNING: the run took {total / 60:.1f} min, over the budget of {BUDGET_MIN:.0f} min "
                      f"(CI allows 90): make the slowest stage share more", red=True, bold=True)
    out = ROOT / "var" / "test-stages.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"stages": dict(rows), "total_s": total, "budget_min": BUDGET_MIN,
                               "outcomes": _clock.outcomes, "modules": _clock.modules, **_provenance(),
                               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}, indent=1))
