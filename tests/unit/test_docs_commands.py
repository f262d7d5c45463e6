"""Every ``baton`` command that README.md and docs/ show in a shell block names a command that exists,
with options it takes: each is run through the CLI with ``--help`` appended (click parses every option
before the eager ``--help`` answers, so a renamed command or option fails here; nothing starts). What the
commands do is the e2e tests' part."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(?:bash|sh|shell|console)?\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`((?:\.venv/bin/)?baton [^`]+)`")  # `baton keys list --json` in a sentence
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"|", "||", "&&", ";", ">", ">>", "<", "&", "2>", "2>&1", "(", ")"}


def doc_commands(text: str) -> list[list[str]]:
    """The argument lists of the ``baton`` commands in a document's shell blocks (after ``$ ``, environment
    assignments, ``.venv/bin/`` and ``$(...)``; cut at pipes, redirections and ``&&``) and in its inline code
    (``...`` stands for what the sentence leaves out: not a command)."""
    out: list[list[str]] = []
    inline = "\n".join(span for span in INLINE.findall(BLOCK.sub("", text)) if "..." not in span)
    for block in [*BLOCK.findall(text), inline]:
        for raw in block.replace("\\\n", " ").splitlines():
            line = raw.strip().removeprefix("$ ")
            if not line or line.startswith("#"):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>()")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            try:
                tokens = list(lexer)
            except ValueError:  # an unclosed quote: not a command line
                continue
            command: list[str] = []
            for tok in [*tokens, ";"]:
                if tok in SEPARATORS or tok.startswith(">") or tok.endswith("$"):
                    if command:
                        out.append(command)
                    command = []
                    continue
                if not command and ASSIGNMENT.match(tok):
                    continue
                command.append(tok)
    return [c[1:] for c in out if c[0] in ("baton", ".venv/bin/baton", "./.venv/bin/baton")]


def _all() -> list[tuple[str, list[str]]]:
    """Each documented command once (the first document that shows it names it)."""
    seen: dict[tuple[str, ...], str] = {}
    for doc in DOCS:
        for args in doc_commands(doc.read_text()):
            seen.setdefault(tuple(args), f"{doc.relative_to(ROOT)}: baton {' '.join(args)}")
    return [(where, list(args)) for args, where in seen.items()]


@pytest.mark.parametrize(("where", "args"), _all(), ids=[w for w, _ in _all()])
def test_every_documented_command_and_option_exists(where: str, args: list[str]) -> None:
    from baton.cli.main import app

    if "--" in args:  # what follows goes to another program (bench vllm): ours ends there
        args = args[: args.index("--")]
    out = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, f"{where}\n{out.output}"


def test_the_reader_finds_commands_in_blocks_and_skips_the_rest() -> None:
    text = ("```bash\n$ FOO=1 .venv/bin/baton keys create -t acme \\\n  --name ci | jq .\n"
            "curl -s localhost | baton nothing-real\n# baton in a comment\nKEY=$(baton keys list --json)\n```\n"
            "and `baton keys revoke -t acme ID` in a sentence, `baton bench ...` a sketch\n")
    assert doc_commands(text) == [["keys", "create", "-t", "acme", "--name", "ci"], ["nothing-real"],
                                  ["keys", "list", "--json"], ["keys", "revoke", "-t", "acme", "ID"]]
    assert len(_all()) >= 20  # the documents do show commands: a reader that finds none is broken


def test_a_renamed_option_or_command_fails_the_check() -> None:
    from baton.cli.main import app

    for args in (["keys", "create", "--tenant-name", "x"], ["keys", "remove", "x"]):
        assert CliRunner().invoke(app, [*args, "--help"]).exit_code != 0
