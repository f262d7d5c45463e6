"""docs/benchmarks.md's generated tables are what `baton bench report` writes from the committed JSON."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from baton.bench import docreport

DOCS = Path(__file__).resolve().parents[3] / "docs"


def test_the_documents_tables_are_in_sync_with_the_committed_json() -> None:
    doc = DOCS / "benchmarks.md"
    assert docreport.blocks(doc.read_text()), "no generated blocks in docs/benchmarks.md"
    assert docreport.check(doc) == [], "run `baton bench report`"


def test_a_changed_figure_puts_the_document_out_of_sync_and_report_rewrites_it(tmp_path: Path) -> None:
    shutil.copy(DOCS / "bench-idle.json", tmp_path / "bench-idle.json")
    doc = tmp_path / "b.md"
    doc.write_text("intro\n<!-- report:idle -->\nstale\n<!-- /report -->\nafter\n")
    assert docreport.check(doc) == ["idle"]
    assert docreport.write(doc) and docreport.check(doc) == []
    data = json.loads((tmp_path / "bench-idle.json").read_text())
    data["stack_core_share"] = 0.5
    (tmp_path / "bench-idle.json").write_text(json.dumps(data))
    assert docreport.check(doc) == ["idle"]
    assert "**50.0%**" in docreport.render_block("idle", tmp_path)
    assert doc.read_text().startswith("intro\n") and doc.read_text().endswith("<!-- /report -->\nafter\n")


def test_a_result_without_provenance_cannot_be_shown(tmp_path: Path) -> None:
    data = json.loads((DOCS / "bench-idle.json").read_text())
    del data["provenance"]
    (tmp_path / "bench-idle.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="provenance"):
        docreport.render_block("idle", tmp_path)
