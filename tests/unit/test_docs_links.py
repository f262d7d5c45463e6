"""The documents' links and the files they name resolve: a page renamed or removed fails here, not in
a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")  # [text](target) and [text](target#anchor)
NAMED = re.compile(r"`(docs/[a-z0-9_./-]+\.(?:md|json|png))`")  # `docs/x.md` named in the text (not a pattern)


def _targets(doc: Path) -> list[tuple[str, Path]]:
    text = doc.read_text()
    out = [(t, doc.parent / t) for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]
    out += [(t, ROOT / t) for t in NAMED.findall(text)]
    return out


def test_every_relative_link_and_named_document_exists() -> None:
    missing = [f"{doc.relative_to(ROOT)}: {target}" for doc in DOCS for target, path in _targets(doc)
               if not path.exists()]
    assert missing == []


def test_the_check_sees_links_and_names() -> None:
    found = {t for t, _ in _targets(ROOT / "README.md")}
    assert "docs/architecture.md" in found  # a named document
    assert any(t == "architecture.md" for doc in DOCS for t, _ in _targets(doc))  # a relative link
