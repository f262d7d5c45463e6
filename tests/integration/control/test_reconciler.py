"""The reconciler on real Postgres, with Ray Serve faked behind the ServeClient interface (the real
client is exercised against a real Ray head in tests/e2e/test_reconciler.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import select, text

from baton.control.ray_client import ServeApp, ServeStatus
from baton.control.reconciler import LOCK_KEY, Reconciler
from baton.core import errors
from baton.core import models as m

from .conftest import unique


class FakeServe:
    """Serve's declarative semantics: a PUT replaces the set of apps; changed apps redeploy."""

    def __init__(self) -> None:
        self.apps: dict[str, ServeApp] = {}
        self.puts: list[dict[str, Any]] = []
        self.fail: list[errors.BatonError] = []
        self.down = False

    def status(self) -> ServeStatus:
        if self.down:
            raise errors.UnavailableError("The Ray dashboard is unreachable.")
        return ServeStatus(apps=dict(self.apps))

    def apply(self, config: dict[str, Any]) -> None:
        if self.fail:
            raise self.fail.pop(0)
        self.puts.append(config)
        # a PUT governs the declarative apps only: one run with serve.run stays
        new: dict[str, ServeApp] = {n: a for n, a in self.apps.items() if not a.managed}
        for e in config["applications"]:
            old = self.apps.get(e["name"])
            if old is not None and old.matches(e):
                new[e["name"]] = old
            else:
                new[e["name"]] = ServeApp(name=e["name"], status="DEPLOYING", config=dict(e))
        self.apps = new

    def settle(self, status: str = "RUNNING", message: str = "") -> None:
        self.apps = {n: ServeApp(n, status, message, a.config, source=a.source) for n, a in self.apps.items()}


@pytest.fixture
def serve() -> FakeServe:
    return FakeServe()


@pytest.fixture
def reconciler(db, serve: FakeServe) -> Reconciler:  # type: ignore[no-untyped-def]
    return Reconciler(db, serve, attempts=3, backoff_s=0.5, sleep=lambda s: None)


@pytest.fixture
def model_id(db) -> uuid.UUID:  # type: ignore[no-untyped-def]
    with db.system() as uow:
        row = uow.models.add(m.Model(name=unique("tiny"), source="/models/tiny", context_length=2048, num_layers=2,
                                     num_kv_heads=2, head_dim=32, dtype="float32"))
        uow.commit()
        return row.id


def _deployment(db, model_id: uuid.UUID, **over: Any) -> uuid.UUID:  # type: ignore[no-untyped-def]
    with db.system() as uow:
        fields: dict[str, Any] = {"engine_settings": {"max_model_len": 512}, "mode": m.DeploymentMode.AGGREGATED,
                                  **over}
        d = uow.deployments.add(m.Deployment(name=unique("d"), model_id=model_id, **fields))
        uow.commit()
        return d.id


def _row(db, dep_id: uuid.UUID) -> dict[str, Any] | None:  # type: ignore[no-untyped-def]
    with db.system() as uow:
        d = uow.deployments.get(dep_id)
        if d is None:
            return None
        return {"name": d.name, "observed": d.observed_state.value, "reason": d.observed_reason,
                "generation": d.generation, "observed_generation": d.observed_generation, "version": d.version}


def _audit_actions(db, target_id: uuid.UUID) -> list[str]:  # type: ignore[no-untyped-def]
    with db.system() as uow:
        rows = uow.audit.scalars(select(m.AuditLog).where(m.AuditLog.target_id == str(target_id))
                                 .order_by(m.AuditLog.id))
        return [f"{r.actor} {r.action}" for r in rows]


def test_apply_then_observe_running_and_stay_idempotent(db, serve, reconciler, model_id) -> None:
    dep = _deployment(db, model_id)
    name = _row(db, dep)["name"]  # type: ignore[index]
    r1 = reconciler.reconcile()
    assert r1.applied and name in serve.apps
    assert _row(db, dep)["observed"] == "deploying"  # type: ignore[index]
    assert serve.apps[name].config["route_prefix"] == f"/{name}"

    serve.settle()
    r2 = reconciler.reconcile()
    assert not r2.applied  # Serve already runs exactly this: nothing is sent
    row = _row(db, dep)
    assert row["observed"] == "running" and row["observed_generation"] == 1  # type: ignore[index]
    assert row["version"] == 1  # type: ignore[index]  # observing never changes the ETag
    puts = len(serve.puts)
    reconciler.reconcile()
    assert len(serve.puts) == puts
    assert "system:reconciler deployment.observed" in _audit_actions(db, dep)


def test_an_app_run_with_serve_run_is_left_alone_and_never_makes_a_pass_apply(db, serve, reconciler,
                                                                               model_id) -> None:
    dep = _deployment(db, model_id)
    name = _row(db, dep)["name"]  # type: ignore[index]
    serve.apps["someone-elses"] = ServeApp("someone-elses", "RUNNING", source="imperative")
    assert reconciler.reconcile().applied
    serve.settle()
    puts = len(serve.puts)
    assert not reconciler.reconcile().applied  # Baton's apps run exactly: the other app is not a difference
    assert len(serve.puts) == puts
    assert set(serve.apps) >= {name, "someone-elses"} and _row(db, dep)["observed"] == "running"  # type: ignore[index]
    # a declarative app Baton does not hold is a difference: the next PUT removes it
    serve.apps["stale"] = ServeApp("stale", "RUNNING", source="declarative")
    assert reconciler.reconcile().applied and "stale" not in serve.apps and "someone-elses" in serve.apps


def test_a_pd_deployment_is_two_serve_apps_and_runs_only_when_both_do(db, serve, reconciler, model_id) -> None:
    dep = _deployment(db, model_id, mode=m.DeploymentMode.PD, kv_connector="nixl", prefill_min_replicas=1,
                      prefill_max_replicas=1)
    name = _row(db, dep)["name"]  # type: ignore[index]
    reconciler.reconcile()
    prefill = f"{name}.prefill"
    assert set(serve.apps) >= {name, prefill}
    assert serve.apps[prefill].config["route_prefix"] == f"/{name}.prefill"
    assert serve.apps[prefill].config["import_path"] == "baton.dataplane.app:build_prefill_app"

    serve.settle()  # both run
    reconciler.reconcile()
    assert _row(db, dep)["observed"] == "running"  # type: ignore[index]

    # The prefill pool's app fails: the deployment is failed, with its reason; Serve still has both apps.
    serve.apps[prefill] = ServeApp(prefill, "DEPLOY_FAILED", "prefill engine failed", serve.apps[prefill].config)
    reconciler.reconcile()
    row = _row(db, dep)
    assert row["observed"] == "failed" and "prefill engine failed" in row["reason"]  # type: ignore[index]

    # Serve lost the prefill app: not running (the next pass applies it again).
    del serve.apps[prefill]
    r = reconciler.reconcile()
    assert r.applied and prefill in serve.apps
    assert _row(db, dep)["observed"] == "deploying"  # type: ignore[index]

    # Stopped: removing until Serve has neither app.
    with db.system() as uow:
        uow.deployments.require(dep).desired_state = m.DesiredState.STOPPED
        uow.commit()
    reconciler.reconcile()
    assert name not in serve.apps and prefill not in serve.apps
    assert _row(db, dep)["observed"] == "stopped"  # type: ignore[index]


def test_a_changed_spec_is_a_new_generation_until_serve_runs_it(db, serve, reconciler, model_id) -> None:
    dep = _deployment(db, model_id)
    reconciler.reconcile()
    serve.settle()
    reconciler.reconcile()
    with db.system() as uow:
        d = uow.deployments.require(dep)
        d.decode_max_replicas = 3
        d.generation += 1
        uow.commit()
    serve.fail = [errors.UnavailableError("down"), errors.UpstreamError("500")]
    r = reconciler.reconcile()
    assert r.applied  # third attempt got through
    name = _row(db, dep)["name"]  # type: ignore[index]
    assert serve.apps[name].config["args"]["replicas"]["max"] == 3
    serve.settle()
    reconciler.reconcile()
    assert _row(db, dep)["observed_generation"] == 2  # type: ignore[index]


def test_a_failed_apply_never_claims_the_new_state(db, serve, reconciler, model_id) -> None:
    dep = _deployment(db, model_id)
    reconciler.reconcile()
    serve.settle()
    reconciler.reconcile()
    with db.system() as uow:
        d = uow.deployments.require(dep)
        d.decode_max_replicas = 2
        d.generation += 1
        uow.commit()
    serve.fail = [errors.UnavailableError("down")] * 3
    r = reconciler.reconcile()
    assert r.apply_error and not r.applied
    row = _row(db, dep)
    # Serve still runs generation 1: the row says so, and why the new one is not there.
    assert row["observed_generation"] == 1 and "apply failed" in row["reason"]  # type: ignore[index]
    assert row["observed"] == "running"  # type: ignore[index]
    with db.system() as uow:
        failed = uow.audit.scalars(select(m.AuditLog).where(m.AuditLog.action == "serve.apply_failed"))
        assert failed and failed[-1].after["attempts"] == 3

    serve.fail = [errors.ConfigurationError("bad config", rejected=True)]
    r = reconciler.reconcile()
    assert r.apply_rejected and _row(db, dep)["observed"] == "failed"  # type: ignore[index]
    r = reconciler.reconcile()  # the next pass repairs it
    serve.settle()
    reconciler.reconcile()
    assert _row(db, dep)["observed"] == "running" and _row(db, dep)["observed_generation"] == 2  # type: ignore[index]


def test_serve_unreachable_marks_running_rows_unhealthy(db, serve, reconciler, model_id) -> None:
    dep = _deployment(db, model_id)
    reconciler.reconcile()
    serve.settle()
    reconciler.reconcile()
    serve.down = True
    r = reconciler.reconcile()
    assert r.apply_error and _row(db, dep)["observed"] == "unhealthy"  # type: ignore[index]
    serve.down = False
    reconciler.reconcile()
    assert _row(db, dep)["observed"] == "running"  # type: ignore[index]


def test_drift_is_repaired_and_deleted_rows_go_once_serve_drops_them(db, serve, reconciler, model_id) -> None:
    dep = _deployment(db, model_id)
    name = _row(db, dep)["name"]  # type: ignore[index]
    reconciler.reconcile()
    serve.settle()
    reconciler.reconcile()
    del serve.apps[name]  # someone deleted the app behind Baton's back
    r = reconciler.reconcile()
    assert r.applied and name in serve.apps

    with db.system() as uow:
        d = uow.deployments.require(dep)
        d.desired_state = m.DesiredState.DELETED
        uow.commit()
    r = reconciler.reconcile()
    assert name not in serve.apps and name in r.removed
    assert _row(db, dep) is None
    assert _audit_actions(db, dep)[-1] == "system:reconciler deployment.removed"


def test_stopped_and_invalid_rows(db, serve, reconciler, model_id) -> None:
    stopped = _deployment(db, model_id, desired_state=m.DesiredState.STOPPED)
    bad = _deployment(db, model_id, engine_settings={"not_a_setting": True})
    r = reconciler.reconcile()
    assert _row(db, stopped)["name"] not in serve.apps and _row(db, stopped)["observed"] == "stopped"  # type: ignore[index]
    assert _row(db, bad)["observed"] == "failed" and "not_a_setting" in _row(db, bad)["reason"]  # type: ignore[index]
    assert _row(db, bad)["name"] not in r.apps  # type: ignore[index]
    with db.system() as uow:  # leave nothing behind for the other tests
        for dep in (stopped, bad):
            uow.deployments.delete(uow.deployments.require(dep))
        uow.commit()


def test_one_pass_at_a_time(db, reconciler) -> None:
    with db.system() as uow:
        uow.session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
        assert reconciler.reconcile().locked is False
    assert reconciler.reconcile().locked is True


def test_a_model_source_that_cannot_serve_never_reaches_ray_and_what_serves_keeps_serving(
        db, serve, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    good = tmp_path / "tiny"
    good.mkdir()
    (good / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4,
                                                  "num_key_value_heads": 2, "hidden_size": 128}))
    with db.system() as uow:
        model = uow.models.add(m.Model(name=unique("checked"), source=str(good), context_length=2048, num_layers=2,
                                       num_kv_heads=2, head_dim=32, dtype="float32"))
        uow.commit()
        mid = model.id
    rec = Reconciler(db, serve, attempts=1, backoff_s=0, sleep=lambda s: None, check_sources=True)
    dep = _deployment(db, mid)
    rec.reconcile()
    serve.settle()
    rec.reconcile()
    assert _row(db, dep)["observed"] == "running"  # type: ignore[index]
    name = _row(db, dep)["name"]  # type: ignore[index]
    running = dict(serve.apps[name].config)
    puts = len(serve.puts)

    def source(path: str) -> None:
        with db.system() as uow:
            uow.models.require(mid).source = path
            uow.commit()

    # a live model pointed at a folder that is not there: nothing reaches Ray, the old app keeps serving
    for bad, words in ((str(tmp_path / "typo"), "not a folder"), (str(tmp_path), "no readable config.json")):
        source(bad)
        rec.reconcile()
        assert len(serve.puts) == puts and serve.apps[name].config == running
        row = _row(db, dep)
        assert row["observed"] == "running" and words in row["reason"], row  # type: ignore[index]
    # a shape that is not the catalogue's
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_key_value_heads": 2,
                                                   "head_dim": 32}))
    source(str(wrong))
    rec.reconcile()
    assert len(serve.puts) == puts and "num_layers 4 (the catalogue says 2)" in _row(db, dep)["reason"]  # type: ignore[index]
    # back to a good source: applied again, and the reason is gone
    source(str(good))
    rec.reconcile()
    serve.settle()
    rec.reconcile()
    row = _row(db, dep)
    assert row["observed"] == "running" and not row["reason"], row  # type: ignore[index]
    # a deployment that never ran with a bad source is failed, not sent
    other = _deployment(db, mid)
    source(str(tmp_path / "gone"))
    rec.reconcile()
    assert _row(db, other)["observed"] == "failed" and _row(db, other)["name"] not in serve.apps  # type: ignore[index]


def test_a_generation_that_fails_to_start_in_ray_is_rolled_back_to_the_last_that_ran(
        db, serve, reconciler, model_id) -> None:  # type: ignore[no-untyped-def]
    dep = _deployment(db, model_id)
    name = _row(db, dep)["name"]  # type: ignore[index]
    reconciler.reconcile()
    serve.settle()
    reconciler.reconcile()
    good = dict(serve.apps[name].config)

    def change(**fields: Any) -> None:
        with db.system() as uow:
            d = uow.deployments.require(dep)
            for k, v in fields.items():
                setattr(d, k, v)
            d.generation += 1
            uow.commit()

    # generation 2 reaches Ray and its replicas cannot start: Serve says DEPLOY_FAILED
    change(engine_settings={"max_model_len": 512, "max_num_seqs": 2})
    assert reconciler.reconcile().applied
    assert serve.apps[name].config["args"] != good["args"]
    serve.settle("DEPLOY_FAILED", "replica failed: ValueError: max_num_seqs too small for this model")
    result = reconciler.reconcile()
    # in the same pass, generation 1's applications are sent again as they ran
    assert result.rolled_back == [name] and serve.apps[name].config == good
    row = _row(db, dep)
    assert row["observed_generation"] == 1 and row["generation"] == 2, row  # type: ignore[index]
    assert "generation 2 failed to start in Ray" in row["reason"] and "max_num_seqs" in row["reason"], row  # type: ignore[index]
    assert "system:reconciler deployment.rolled_back" in _audit_actions(db, dep)
    serve.settle()
    puts = len(serve.puts)
    reconciler.reconcile()
    reconciler.reconcile()
    row = _row(db, dep)
    assert len(serve.puts) == puts, "the failed generation is not tried again until the spec changes"
    assert row["observed"] == "running" and row["observed_generation"] == 1 and "generation 2" in row["reason"], row  # type: ignore[index]

    # a new change is tried; once it runs, the failure is history
    change(engine_settings={"max_model_len": 256})
    assert reconciler.reconcile().applied
    serve.settle()
    reconciler.reconcile()
    row = _row(db, dep)
    assert row["observed"] == "running" and row["observed_generation"] == 3 and not row["reason"], row  # type: ignore[index]
    with db.system() as uow:
        d = uow.deployments.require(dep)
        assert d.failed_generation is None and d.last_good is not None and d.last_good["generation"] == 3

    # a deployment that never ran has nothing to go back to: it is failed
    other = _deployment(db, model_id)
    reconciler.reconcile()
    serve.settle("DEPLOY_FAILED", "no")
    assert reconciler.reconcile().rolled_back == []
    assert _row(db, other)["observed"] == "failed"  # type: ignore[index]
