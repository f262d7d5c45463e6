"""``baton plan --json``: one JSON object on stdout (what ``plan.json`` holds), no table, for scripts."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from baton.cli.main import app


def test_plan_json_is_one_object_a_script_can_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = ["plan", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--params-b", "8", "--json"]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "40"})
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)  # nothing but the object: a table or a note would not parse
    assert plan["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2  # K and V, every layer, bf16
    assert plan["recommended"] in {c["name"] for c in plan["configs"]}
    written = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert json.loads(written.output) == json.loads((tmp_path / "plan.json").read_text())
