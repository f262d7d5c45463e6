"""The cross-process contracts (`baton.core.contracts`): payloads survive the trip, the KV formula is the
seed's, and no producer or consumer keeps a copy of its own."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from baton.core import contracts as c

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = Path("platform/core/contracts.py")
SCANNED = ("api", "control", "dataplane", "cli", "bench", "platform")


# --- (a) round trips ----------------------------------------------------------------------------------

STEP = c.RecoveryStep(c.STEP_PREFILL_RETRY, 5.0, 20.25, "recovered", "attempt 2 answered after: prefill died")
PHASES = c.PhasesFact(1_800_000_000.125, (
    c.Phase(c.PHASE_REMOTE_PREFILL, 0.4, 12.0, "failed", attempt=1, detail="prefill failed: ActorDiedError"),
    c.Phase(c.PHASE_REMOTE_PREFILL, 13.0, 30.5, attempt=2),
    c.Phase(c.PHASE_KV_HANDOFF, 44.0, 6.5),
))
FACTS: list[c.Fact] = [
    c.HandoffFact(connector="nixl", kv_bytes=131072, expected_bytes=102400, transfer_ms=3.5, prompt_tokens=100),
    c.KvTransferFact(kv_bytes=131072, expected_bytes=102400, transfer_ms=0.8, wait_ms=1.5, timing="nixl_telemetry",
                     prompt_tokens=100),
    c.KvLoadFailedFact(blocks=2, wait_ms=4.0, t_unix=1_800_000_000.5),
    c.RecoveryStepsFact((STEP, c.RecoveryStep(c.STEP_LOCAL_PREFILL, 50.0, 80.0, "failed", "x", "dataplane"))),
    PHASES,
]


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: f.FIELD.value)
def test_every_fact_survives_redis(fact: c.Fact) -> None:
    name, value = c.encode_fact(fact)
    assert name == fact.FIELD.value
    # what HGETALL gives back from redis-py: bytes keys and values
    back = c.RequestFacts.from_hash({name.encode(): value.encode()})
    assert getattr(back, name) == fact
    assert type(fact).from_json(json.loads(value)) == fact


def test_one_hash_holds_them_all_and_a_bad_field_costs_only_itself() -> None:
    facts = c.RequestFacts.of(FACTS)
    assert (facts.handoff, facts.kv_transfer, facts.kv_load_failed, facts.recovery_steps, facts.phases) == tuple(FACTS)
    raw = dict(c.encode_fact(f) for f in FACTS)
    raw["handoff"] = "{not json"
    raw["phases"] = json.dumps({"phases": []})  # no anchor on the decode server's clock
    raw["from_a_newer_release"] = "{}"
    partial = c.RequestFacts.from_hash(raw)
    assert partial.handoff is None and partial.phases is None and partial.kv_transfer == FACTS[1]


def test_the_fact_key_is_the_gateways_request_id_however_it_travelled() -> None:
    assert c.fact_key("req-abc123") == c.fact_key("abc123") == c.FACT_KEY_PREFIX + "abc123"
    assert c.FACT_TTL_S > 0


def test_recovery_steps_round_trip_and_readers_are_lenient() -> None:
    assert c.RecoveryStep.from_json(STEP.to_json()) == STEP
    assert "source" not in STEP.to_json()  # the gateway's own steps, as records have always held them
    gap = c.RecoveryStep(c.STEP_DECODE_RESUME, 5.0, 9.0, "recovered", "x", client_gap_ms=80.5)
    assert c.RecoveryStep.from_json(gap.to_json()) == gap and "client_gap_ms" not in STEP.to_json()
    timed = c.RecoveryStep.timed(c.STEP_DECODE_RESUME, origin_pc=10.0, started_pc=10.5, now_pc=10.75,
                                 outcome="recovered", detail="y" * 500)
    assert (timed.at_ms, timed.duration_ms, len(timed.detail)) == (500.0, 250.0, c.DETAIL_MAX)
    assert c.RecoveryStep.from_json({"step": "decode_resume"}) == c.RecoveryStep("decode_resume", 0.0, 0.0, "")
    for bad in ({"at_ms": 1}, [], "decode_resume", {"step": 3}):
        with pytest.raises(ValueError):
            c.RecoveryStep.from_json(bad)
    steps = c.RecoveryStepsFact.from_json([STEP.to_json(), {"no": "name"}, 7])
    assert steps.steps == (STEP,)
    names = {"prefill_retry", "local_prefill", "kv_recompute", "decode_resume", "aggregated_fallback"}
    assert names == c.RECOVERY_STEP_NAMES
    assert set(c.PREFILL_STEPS) < c.RECOVERY_STEP_NAMES


def test_phases_move_onto_the_gateways_axis() -> None:
    started = PHASES.received_unix - 0.010  # the gateway started the request 10 ms before the decode server
    moved = PHASES.on_request_axis(started)
    assert [p.start_ms for p in moved] == pytest.approx([10.4, 23.0, 54.0])
    assert [p.duration_ms for p in moved] == [p.duration_ms for p in PHASES.phases]
    # a decode server whose clock is behind the gateway's cannot start before the request did
    assert PHASES.on_request_axis(PHASES.received_unix + 5)[0].start_ms == 0.4
    assert c.phases_from_json([p.to_json() for p in moved]) == moved
    assert c.phases_from_json([{"phase": "teleport", "start_ms": 0, "duration_ms": 1}, None]) == []
    assert c.phases_from_json(None) == []


def test_the_replica_environment_reads_back_what_the_renderer_writes() -> None:
    env = c.ReplicaEnv(facts_redis_url="redis://r:6379/1", prefill=c.PrefillPolicy(2.5, 5, 0.05, False),
                       engine_executor="uni",
                       telemetry=c.ReplicaTelemetry(False, "http://otel:4318", "baton-dataplane-x", 25.0))
    written = env.to_environ()
    assert set(written) <= c.REPLICA_ENV_NAMES
    assert c.ReplicaEnv.from_environ(written) == env
    assert c.ReplicaEnv.from_environ({}) == c.ReplicaEnv()  # nothing set: the defaults, no facts
    assert c.ReplicaEnv.from_environ(c.ReplicaEnv().to_environ()) == c.ReplicaEnv()
    junk = c.ReplicaEnv.from_environ({c.ENV_PREFILL_TIMEOUT_S: "soon", c.ENV_PREFILL_ATTEMPTS: "0",
                                      c.ENV_TELEMETRY_LINK_BANDWIDTH_GBPS: "nan"})
    assert junk.prefill.timeout_s == 10.0 and junk.prefill.attempts == 1 and junk.telemetry.link_bandwidth_gbps == 1.9


def test_the_renderer_writes_the_replica_environment_through_the_contract() -> None:
    from baton.dataplane.render import engine_env, replica_env
    from baton.dataplane.spec import DeploymentSpec

    spec = DeploymentSpec(name="d", model={"path": "/m", "served_name": "m"}, mode="pd",
                          kv={"connector": "nixl", "lmcache": {"redis_url": "redis://tier:6379"}},
                          telemetry={"link_bandwidth_gbps": 12.5})
    assert c.ReplicaEnv.from_environ(engine_env(spec)) == replica_env(spec)
    assert replica_env(spec).facts_redis_url == "redis://tier:6379" and replica_env(spec).engine_executor == "uni"
    # a spec's own env still wins (the chaos harness shortens the ladder that way)
    tuned = spec.model_copy(update={"env": {c.ENV_PREFILL_TIMEOUT_S: "0.5"}})
    assert c.ReplicaEnv.from_environ(engine_env(tuned)).prefill.timeout_s == 0.5


# --- (b) the KV formula -------------------------------------------------------------------------------

def test_kv_formula_is_the_seeds_example() -> None:
    # The seed: 32 layers, 8 KV heads, head_dim 128, BF16, a 4096-token prompt: 536,870,912 bytes = 512 MiB.
    shape = {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128}
    n = c.kv_bytes(**shape, bytes_per_element=c.dtype_bytes("bfloat16"), tokens=4096)
    assert n == 2 * 32 * 8 * 128 * 4096 * 2 == 536_870_912 == 512 * 2**20
    assert c.kv_bytes(**shape, bytes_per_element=2) == 131_072  # per token
    # whole blocks: what NIXL moves
    tiny = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 32, "bytes_per_element": 4}
    assert c.kv_bytes_block_rounded(1, **tiny) == c.kv_bytes_block_rounded(128, **tiny) == 128 * 1024
    assert c.kv_bytes_block_rounded(1000, **tiny) == 8 * 128 * 1024


@pytest.mark.parametrize(("dtype", "size"), [
    ("float32", 4), ("torch.float32", 4), ("float", 4), ("bfloat16", 2), ("torch.bfloat16", 2), ("float16", 2),
    ("half", 2), ("fp8", 1), ("fp8_e4m3", 1), ("fp8_e5m2", 1), ("torch.float8_e4m3fn", 1), ("int8", 1),
])
def test_one_dtype_table(dtype: str, size: int) -> None:
    assert c.dtype_bytes(dtype) == size


def test_an_unknown_dtype_is_never_guessed() -> None:
    for name in ("auto", "nvfp4_ds_mla", ""):
        with pytest.raises(ValueError):
            c.dtype_bytes(name)


def test_every_caller_gets_the_same_answer() -> None:
    from baton.control import pd_cost_model
    from baton.dataplane.tinymodel import DEFAULT_SHAPE
    from baton.dataplane.tracing import ModelShape

    n = pd_cost_model.kv_bytes(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bfloat16", tokens=4096)
    assert n == 512 * 2**20
    assert pd_cost_model.ModelShape(32, 8, 128, "half").kv_bytes_per_token == 131_072
    assert ModelShape(32, 8, 128, 2, 16).bytes_per_token == 131_072
    assert DEFAULT_SHAPE.kv_bytes_per_token(4) == c.kv_bytes(num_layers=2, num_kv_heads=2, head_dim=32,
                                                             bytes_per_element=4)


def test_an_invalidation_reads_back_as_written_and_a_malformed_one_as_none() -> None:
    import uuid

    kid = uuid.uuid4()
    assert c.parse_invalidation(c.invalidation_message("key", kid)) == ("key", kid)
    assert c.parse_invalidation(c.invalidation_message("all").decode()) == ("all", None)
    for bad in (b"", b"not json", b"[]", b'{"id": "x"}', b'{"kind": 3}', b'{"kind": "key", "id": "x"}',
                b'{"kind": "key", "id": 7}'):
        assert c.parse_invalidation(bad) is None, bad


def test_a_flow_view_reads_back_as_written_and_a_malformed_one_as_none() -> None:
    models = [{"model": "m", "limit": 4, "waiting": 2, "tenants": []}]
    assert c.parse_flow_view(c.flow_view_message("host:1", models)) == ("host:1", models)
    assert c.flow_view_key("host:1").startswith(c.FLOW_VIEW_PREFIX)
    for bad in (None, b"", b"not json", b"[]", b'{"process": 1, "models": []}', b'{"process": "p", "models": {}}'):
        assert c.parse_flow_view(bad) is None, bad


# --- (c) one definition each: nothing outside the contracts module spells them --------------------------

DTYPE_NAMES = {"float32", "float", "fp32", "float16", "fp16", "half", "bfloat16", "bf16", "fp8", "float8",
               "fp8_e4m3", "fp8_e5m2", "int8", "uint8", "float64", "double"}
ENV_PREFIXES = ("BATON_PREFILL_", "BATON_DATAPLANE_")
#: The replica's own names that do not share a prefix (the telemetry ones are also the settings tree's,
#: which the gateway's and bench's processes set, so they are checked inside the data plane only).
ENV_EXACT = {n for n in c.REPLICA_ENV_NAMES if not n.startswith("BATON_TELEMETRY__")}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _factors(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _ident(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def contract_copies(root: Path) -> list[str]:
    """Each place outside the contracts module that spells a contract of its own: the fact key prefix, the
    invalidation channel, the flow view key, a replica environment name, a dtype-size table, the KV-size formula."""
    found: list[str] = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            if rel == CONTRACTS:
                continue
            tree = ast.parse(path.read_text(), filename=str(rel))
            docs = _docstrings(tree)
            in_dataplane = rel.parts[0] == "dataplane"
            for node in ast.walk(tree):
                where = f"{rel}:{getattr(node, 'lineno', '?')}"
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                    text = node.value
                    if c.FACT_KEY_PREFIX in text:
                        found.append(f"{where}: the fact key {text!r}")
                    if c.INVALIDATION_CHANNEL in text:
                        found.append(f"{where}: the invalidation channel {text!r}")
                    if c.FLOW_VIEW_PREFIX in text:
                        found.append(f"{where}: the flow view key {text!r}")
                    names = set(re.findall(r"BATON_[A-Z0-9_]+", text))
                    if any(n.startswith(ENV_PREFIXES) for n in names) or names & ENV_EXACT:
                        found.append(f"{where}: a replica environment name {text!r}")
                    if in_dataplane and "BATON_TELEMETRY__" in text:
                        found.append(f"{where}: a replica telemetry variable {text!r}")
                elif isinstance(node, ast.Dict):
                    pairs = zip(node.keys, node.values, strict=True)
                    sizes = {k.value.removeprefix("torch."): v.value for k, v in pairs
                             if isinstance(k, ast.Constant) and isinstance(k.value, str)
                             and isinstance(v, ast.Constant) and isinstance(v.value, int)}
                    if len(sizes.keys() & DTYPE_NAMES) >= 2:
                        found.append(f"{where}: a dtype-size table {sorted(sizes.keys() & DTYPE_NAMES)}")
                elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                    factors = _factors(node)
                    idents = [_ident(f).lower() for f in factors]
                    two = any(isinstance(f, ast.Constant) and f.value == 2 for f in factors)
                    if two and any("layer" in i for i in idents) and any("head" in i for i in idents):
                        found.append(f"{where}: the KV-size formula")
    # a chain a * b * c nests: report each place once
    return sorted(set(found), key=found.index)


def test_no_contract_is_spelled_twice() -> None:
    copies = contract_copies(ROOT)
    assert copies == [], "spelled outside baton.core.contracts (import it instead):\n" + "\n".join(copies)


def test_the_layout_check_sees_each_kind_of_copy(tmp_path: Path) -> None:
    """The check is not vacuous: each kind of copy, written the way the tree used to, is found."""
    (tmp_path / "platform" / "core").mkdir(parents=True)
    (tmp_path / "platform" / "core" / "contracts.py").write_text('P = "baton:req:"\nT = {"float32": 4, "fp8": 1}\n')
    (tmp_path / "dataplane").mkdir()
    (tmp_path / "dataplane" / "facts.py").write_text(
        '"""Docstrings may name ``baton:req:<id>`` and BATON_DATAPLANE_REDIS_URL."""\n'
        'ENV = "BATON_DATAPLANE_REDIS_URL"\n'
        'def fact_key(rid):\n    return f"baton:req:{rid}"\n'
        'def bw(env):\n    return env.get("BATON_TELEMETRY__LINK_BANDWIDTH_GBPS")\n')
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "pd_cost_model.py").write_text(
        'DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}\n'
        'def kv(num_layers, num_kv_heads, head_dim, tokens):\n'
        '    return 2 * num_layers * num_kv_heads * head_dim * tokens * 2\n')
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "stack.py").write_text('ENV = {"BATON_PREFILL_TIMEOUT_S": "1", "BATON_LOCAL_PREFILL": "0"}\n'
                                                 'BENCH = {"BATON_TELEMETRY__ENABLED": "true"}\n')
    found = sorted((line.split(": ", 1)[0], line.split(": ", 1)[1].split(" ")[1]) for line in contract_copies(tmp_path))
    assert found == [
        ("bench/stack.py:1", "replica"), ("bench/stack.py:1", "replica"),  # a prefix, and a name of its own
        ("control/pd_cost_model.py:1", "dtype-size"), ("control/pd_cost_model.py:3", "KV-size"),
        ("dataplane/facts.py:2", "replica"), ("dataplane/facts.py:4", "fact"), ("dataplane/facts.py:6", "replica"),
    ], found
