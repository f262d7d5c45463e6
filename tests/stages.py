"""The suite's stages: in which order tests run, and how long each stage took (a pytest plugin of the
root conftest).

Order: the quick tests (unit and integration) first, while the session's stack comes up in the
background (:mod:`tests.shared_stack`); then the browser tests, the e2e tests, the ``solo`` tests
(benchmarks that load the cores themselves), the chaos drills, and last the tests marked ``last`` (they
stop the shared stack). Within a stage, the collection order.

At the end the run prints the wall time of each stage, with the stages ``scripts/test`` timed before
pytest started (setup, lint, types: ``BATON_TEST_STAGES``, a file of ``name seconds`` lines, and
``BATON_TEST_T0``, the run's start in epoch seconds), and warns when the whole run took longer than
``BATON_TEST_BUDGET_MIN`` minutes (45): CI allows 90, and every new e2e test takes from the difference.
The table is written to ``var/test-stages.json`` too, with each module's time (the setup, call and
teardown of its tests: a module's first setup carries the fixtures it starts, its last teardown the ones
it stops) and the run's provenance; ``scripts/test-durations`` renders it as the table of
``docs/testing.md``.

The lane: tests marked ``own_stack`` run on a Ray head or engines of their own, never on the session's
shared stack. When ``scripts/test`` runs the whole suite (``BATON_TEST_LANES=1``), they leave this session
and run in a second pytest process (the lane, ``BATON_TEST_LANE=1``), started when the first e2e test
starts (the browser tests, with their short UI timeouts, run before it) and waited for before the solo
tests and the chaos drills (which load the cores, kill and time things, and run alone). The lane's output
goes to ``var/test-lane.log``; its failures fail the run, and its modules join the table.
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
ORDER = ("quick", "browser", "e2e", "solo", "chaos", "last")
IN_LANE = os.environ.get("BATON_TEST_LANE") == "1"
LANE_LOG = ROOT / "var" / "test-lane.log"
LANE_JSON = ROOT / "var" / "test-lane-stages.json"
BUDGET_MIN = float(os.environ.get("BATON_TEST_BUDGET_MIN", "45"))
_load_at_start = os.getloadavg()[0]  # the machine's load as pytest started (provenance)


def stage_of(item: pytest.Item) -> str:
    for name in ("last", "chaos", "solo", "e2e", "browser"):
        if item.get_closest_marker(name) is not None:
            return name
    return "quick"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "last: runs after every other test (it stops the session's shared stack)")
    config.addinivalue_line("markers", "own_stack: runs on a Ray head or engines of its own (the lane, beside "
                                       "the e2e stage, when scripts/test runs the whole suite)")
    config.addinivalue_line("markers", "solo: loads the machine's cores itself (a benchmark under load): runs after "
                                       "the e2e stage and the lane, with nothing beside it")


class _Lane:
    """The second pytest process of ``own_stack`` tests (see the module's docstring)."""

    def __init__(self) -> None:
        self.nodeids: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.rc: int | None = None
        self.started = self.ended = 0.0
        self.waited = 0.0  # how long the main run stood waiting for it

    def start(self) -> None:
        if self.proc is not None or not self.nodeids:
            return
        LANE_LOG.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "BATON_TEST_LANE": "1"}
        env.pop("BATON_TEST_STAGES", None)  # setup, lint and types are the main run's
        self.started = time.time()
        with LANE_LOG.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfE",
                                          *self.nodeids], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait(self) -> None:
        if self.proc is None or self.rc is not None:
            return
        t = time.time()
        self.rc = self.proc.wait()
        self.ended = time.time()
        self.waited += self.ended - t

    def stop(self) -> None:
        if self.proc is not None and self.rc is None:
            self.proc.terminate()
            try:
                self.rc = self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.rc = self.proc.wait()
            self.ended = time.time()


_lane = _Lane()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(ORDER)}
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (rank[stage_of(item)], order[id(item)]))
    if IN_LANE or os.environ.get("BATON_TEST_LANES") != "1" or config.option.collectonly:
        return
    own = [item for item in items if item.get_closest_marker("own_stack") is not None]
    if own and len(own) < len(items):
        _lane.nodeids = [item.nodeid for item in own]
        items[:] = [item for item in items if item.get_closest_marker("own_stack") is None]


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
    stage = stage_of(item)
    if stage == "e2e":
        _lane.start()
    elif stage in ("solo", "chaos", "last"):
        _lane.wait()
    start = time.time()
    yield
    _clock.seen(stage, start, time.time())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.shouldstop or session.shouldfail:
        _lane.stop()
    _lane.start()  # a run with nothing but the lane after the quick tests
    _lane.wait()
    if _lane.rc not in (None, 0) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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


def _merge_lane(tr: pytest.TerminalReporter) -> dict[str, object]:
    """The lane's modules and outcomes joined to this run's; its log's summary shown when it failed."""
    if _lane.proc is None:
        return {}
    report: dict = {}
    if LANE_JSON.exists():
        report = json.loads(LANE_JSON.read_text())
        for module, row in report.get("modules", {}).items():
            _clock.modules[module] = {**row, "stage": f"{row.get('stage') or 'e2e'} (lane)"}
        for outcome, n in report.get("outcomes", {}).items():
            _clock.outcomes[outcome] = _clock.outcomes.get(outcome, 0) + n
    if _lane.rc != 0:
        tr.section("the lane (own_stack tests) failed", red=True)
        text = LANE_LOG.read_text(errors="replace") if LANE_LOG.exists() else ""
        tr.write_line(text[-20000:])
    lines = LANE_LOG.read_text(errors="replace").strip().splitlines() if LANE_LOG.exists() else []
    summary = lines[-1].strip("= ") if lines else f"no output, rc {_lane.rc}"
    # its own wall time (it may have ended well before this run waited for it)
    wall = float(report.get("total_s") or (_lane.ended - _lane.started))
    return {"lane": {"tests": len(_lane.nodeids), "rc": _lane.rc, "wall_s": wall,
                     "summary": summary, "log": str(LANE_LOG.relative_to(ROOT))}}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    now = time.time()
    rows = _before_pytest()
    # the pytest stages, each from its first test's start to its last test's end; what lies between
    # (collection, session fixtures' teardown) is the rest of pytest's time
    staged = [(name, _clock.spans[name][1] - _clock.spans[name][0]) for name in ORDER if name in _clock.spans]
    if _lane.waited:
        staged.append(("lane wait", _lane.waited))
    pytest_s = now - _clock.t_pytest
    rows += [*staged, ("pytest other", max(0.0, pytest_s - sum(s for _, s in staged)))]
    t0 = float(os.environ.get("BATON_TEST_T0") or _clock.t_pytest)
    total = now - t0
    tr = terminalreporter
    lane = _merge_lane(tr)
    tr.section("wall time per stage")
    for name, seconds in rows:
        tr.write_line(f"{name:<14} {seconds / 60:6.1f} min  ({seconds:7.0f} s)")
    if lane:
        seconds = lane["lane"]["wall_s"]
        tr.write_line(f"{'(lane)':<14} {seconds / 60:6.1f} min  ({seconds:7.0f} s)  beside the e2e stage: "
                      f"{lane['lane']['summary']} ({lane['lane']['log']})")
    tr.write_line(f"{'total':<14} {total / 60:6.1f} min  ({total:7.0f} s)")
    if total > BUDGET_MIN * 60:
        tr.write_line(f"WARNING: the run took {total / 60:.1f} min, over the budget of {BUDGET_MIN:.0f} min "
                      f"(CI allows 90): make the slowest stage share more", red=True, bold=True)
    out = LANE_JSON if IN_LANE else ROOT / "var" / "test-stages.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"stages": dict(rows), "total_s": total, "budget_min": BUDGET_MIN,
                               "outcomes": _clock.outcomes, "modules": _clock.modules, **lane, **_provenance(),
                               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}, indent=1))
