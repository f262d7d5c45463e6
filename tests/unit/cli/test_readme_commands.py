"""The README's list of commands names every command and subcommand of the installed CLI, so that a new
command cannot go unmentioned (and a removed one cannot stay)."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

ROOT = Path(__file__).resolve().parents[3]


def _readme_commands() -> set[str]:
    text = (ROOT / "README.md").read_text()
    para = text[text.index("`baton --help` lists every command"):]
    para = para[len("`baton --help`"):para.index("\n\n")]
    out: set[str] = set()
    for item in re.findall(r"`([a-z][a-z |-]*)`", para):
        group, _, subs = item.partition(" ")
        if not subs:
            out.add(group)
            continue
        for sub in subs.split("|"):
            out.add(f"{group} {sub}")
    return out


def test_the_readme_names_every_command_of_the_cli() -> None:
    from baton.cli.main import app

    cli = typer.main.get_command(app)
    names: set[str] = set()
    for name, cmd in cli.commands.items():  # type: ignore[attr-defined]
        subs = getattr(cmd, "commands", None)
        names |= {f"{name} {s}" for s in subs} if subs else {name}
    listed = _readme_commands()
    assert names - listed == set(), f"commands the README leaves out: {sorted(names - listed)}"
    assert listed - names == set(), f"commands the README names that the CLI lacks: {sorted(listed - names)}"
