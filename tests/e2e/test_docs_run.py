"""The shell blocks that README.md and docs/ mark ``<!-- runnable -->`` run as written against the
session's stack, with ``bash -euo pipefail``: once from the checkout and once from a folder outside it
(the stack's settings found through ``BATON_STATE_DIR``, as the README says), so a doc whose command,
option, output shape or working folder drifts fails here. The other documented commands are checked
with ``--help`` (:mod:`tests.unit.test_docs_commands`): they start engines or write files."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared_stack import BatonStack

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = re.compile(r"^<!-- runnable -->\n```(?:bash|sh)\n(.*?)^```", re.M | re.S)


def runnable_blocks() -> list[tuple[str, str]]:
    return [(f"{doc.relative_to(ROOT)}#{i}", block) for doc in DOCS
            for i, block in enumerate(RUNNABLE.findall(doc.read_text()))]


def test_the_docs_mark_blocks_runnable() -> None:
    assert runnable_blocks(), "no <!-- runnable --> block in README.md or docs/: the reader or the docs changed"


@pytest.mark.parametrize(("where", "block"), runnable_blocks(), ids=[w for w, _ in runnable_blocks()])
def test_a_runnable_block_runs_from_the_checkout_and_from_elsewhere(baton_stack: BatonStack, tmp_path: Path,
                                                                   where: str, block: str) -> None:
    if shutil.which("jq") is None and "jq" in block:
        pytest.skip("jq is not installed on this machine")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("BATON_")}, **baton_stack.env,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "80"}
    for cwd in (ROOT, tmp_path):
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, f"{where} from {cwd}: exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    if "keys create" in block:  # the README's key round trip: what it made, it revoked (twice)
        live = subprocess.run([str(Path(sys.executable).parent / "baton"), "keys", "list", "--tenant", "demo",
                               "--json"], env=env, capture_output=True, text=True, timeout=120, check=True)
        names = [json.loads(line)["name"] for line in live.stdout.splitlines() if line.strip()]
        assert "from-a-script" not in names, names
