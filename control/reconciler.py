"""The reconciler: makes Ray Serve run what Postgres says, and writes back what Serve really runs.

One pass (:meth:`Reconciler.reconcile`):

1. Take the reconcile lock (a Postgres advisory lock held for the pass): two passes never interleave.
2. Read every deployment. Those with ``desired_state = running`` become one Serve application each
   (:func:`baton.control.spec_rows.deployment_spec` -> :func:`baton.dataplane.render.render_serve_config`);
   a row the data plane would refuse, or whose model's source fails its check (:mod:`baton.control.sources`),
   never reaches Ray: if Serve already runs an earlier generation of it, that one keeps serving (its
   applications are sent as they run, the row says why its new generation was refused); otherwise the
   row is marked ``failed`` with the reason.
3. Read Serve's status. If it already runs exactly these applications, nothing is sent (idempotent; an
   application someone ran with ``serve.run`` on the same cluster is not Baton's and a ``PUT`` keeps it);
   otherwise the whole config is ``PUT``, retried with exponential backoff. A rejected or failing apply
   changes nothing in the database except the reason: the rows keep reporting what Serve runs.
4. Read Serve's status again and write it into the rows (``observed_state``, ``observed_reason``,
   ``observed_generation`` = the generation Serve runs, if it runs this row's current spec). Rows whose
   ``desired_state`` is ``deleted`` are removed once Serve no longer has their application.

Every apply, state change and removal is an ``audit_log`` row (actor ``system:reconciler``). Observed
fields are written with plain UPDATEs that leave the row's ``version`` (its ETag) alone: the ETag
changes only when someone changes the desired state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from baton.control.audit import jsonable
from baton.control.ray_client import APP_STATUS_TO_OBSERVED, ServeClient, ServeStatus
from baton.control.slo import EngineThroughput
from baton.control.sources import source_problem
from baton.control.spec_rows import deployment_spec, throughput_from
from baton.core import errors
from baton.core import models as m
from baton.core.db import Database, UnitOfWork
from baton.core.repositories import SYSTEM_ACTOR_PREFIX
from baton.dataplane.render import PREFILL_APP_SUFFIX, render_serve_applications, render_serve_config

log = logging.getLogger(__name__)

ACTOR = f"{SYSTEM_ACTOR_PREFIX}reconciler"
#: Key of the advisory lock that serialises reconcile passes across workers.
#: Observed states from best to worst: a deployment of several Serve applications is its worst one.
_SEVERITY = ("running", "deploying", "unhealthy", "failed")
LOCK_KEY = int.from_bytes(hashlib.sha256(b"baton.reconciler").digest()[:8], "big", signed=True)


@dataclass
class ReconcileResult:
    """What one pass did."""

    locked: bool = True
    applied: bool = False
    apply_error: str | None = None
    apply_rejected: bool = False
    apps: list[str] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    #: Deployments whose current generation was found failed to start this pass (their last good
    #: generation is sent again at once).
    rolled_back: list[str] = field(default_factory=list)

    @property
    def converged(self) -> bool:
        """Everything desired runs (or is gone); nothing is still on its way."""
        return self.locked and self.apply_error is None and all(
            s in ("running", "stopped", "failed") for s in self.states.values()
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "locked": self.locked, "applied": self.applied, "apply_error": self.apply_error,
            "apps": self.apps, "states": self.states, "removed": self.removed, "converged": self.converged,
            "rolled_back": self.rolled_back,
        }


@dataclass(frozen=True)
class _Row:
    id: uuid.UUID
    name: str
    desired: str
    observed: str
    reason: str | None
    generation: int
    observed_generation: int
    last_good: dict[str, Any] | None = None
    failed_generation: int | None = None
    failed_reason: str | None = None


class Reconciler:
    def __init__(
        self,
        db: Database,
        client: ServeClient,
        *,
        http_port: int = 8001,
        attempts: int = 4,
        backoff_s: float = 1.0,
        throughput: Callable[[dict[str, Any]], EngineThroughput] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        telemetry: dict[str, Any] | None = None,
        check_sources: bool = False,
    ) -> None:
        self.db = db
        self.check_sources = check_sources
        self.telemetry = telemetry  # DeploymentSpec.telemetry for every app: spans and per-request facts
        self.client = client
        self.http_port = http_port
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.throughput = throughput
        self.sleep = sleep

    @classmethod
    def from_settings(cls, settings: Any, db: Database, client: ServeClient) -> Reconciler:
        return cls(
            db, client,
            http_port=settings.ray.serve_http_port,
            attempts=settings.control.apply_attempts,
            backoff_s=settings.control.apply_backoff_s,
            throughput=lambda engine: throughput_from(settings, engine),
            check_sources=settings.control.check_model_sources,
            telemetry={
                "otlp_endpoint": settings.telemetry.otlp_endpoint,
                "link_bandwidth_gbps": settings.telemetry.link_bandwidth_gbps,
                "enabled": settings.telemetry.enabled,
                # The gateway reads the data plane's facts from its own Redis.
                "facts_redis_url": settings.redis.url,
            },
        )

    # -- the pass ----------------------------------------------------------------------------------

    def reconcile(self) -> ReconcileResult:
        with self.db.system() as lock_uow:
            if not lock_uow.deployments.try_reconcile_lock(LOCK_KEY):
                return ReconcileResult(locked=False)
            result = self._pass()
            if result.rolled_back:  # a generation failed to start: send the last good one now
                rolled_back = result.rolled_back
                result = self._pass()
                result.rolled_back = rolled_back
            return result

    def _pass(self) -> ReconcileResult:
        result = ReconcileResult()
        rows, entries, invalid = self._desired()
        status = self._status()
        if status is None:
            self._unreachable(rows)
            result.apply_error = "The Ray dashboard is unreachable."
            result.states = {r.name: "unhealthy" for r in rows.values() if r.desired == "running"}
            return result
        kept = _keep_last_good(rows, invalid, status, entries)
        rolled = _roll_back(rows, invalid, entries)
        config = render_serve_config([], http_port=self.http_port)
        config["applications"] = entries
        result.apps = [e["name"] for e in entries]

        if not _runs_exactly(status, entries):
            error, rejected = self._apply(config, status)
            result.apply_rejected = rejected
            if error is None:
                result.applied = True
                status = self._status() or status
            else:
                result.apply_error = error

        self._observe(rows, entries, {k: v for k, v in invalid.items() if k not in kept}, status, result,
                      refused={k: invalid[k] for k in kept}, rolled=rolled)
        return result

    def _desired(self) -> tuple[dict[uuid.UUID, _Row], list[dict[str, Any]], dict[uuid.UUID, str]]:
        """Rows, the Serve application entries of those that should run, and the invalid ones."""
        rows: dict[uuid.UUID, _Row] = {}
        entries: list[dict[str, Any]] = []
        invalid: dict[uuid.UUID, str] = {}
        with self.db.system() as uow:
            deps = uow.deployments.list()
            models = {mod.id: mod for mod in uow.models.list()}
            policies = {p.id: p for p in uow.slo_policies.list()}
            for d in deps:
                rows[d.id] = _Row(d.id, d.name, d.desired_state.value, d.observed_state.value, d.observed_reason,
                                  d.generation, d.observed_generation, d.last_good, d.failed_generation,
                                  d.failed_reason)
                if d.desired_state is not m.DesiredState.RUNNING:
                    continue
                policy = policies.get(d.slo_policy_id) if d.slo_policy_id else None
                tp = self.throughput(d.engine_settings or {}) if (policy and self.throughput) else None
                try:
                    spec = deployment_spec(d, models[d.model_id], policy=policy, throughput=tp,
                                           telemetry=self.telemetry)
                except errors.ValidationError as exc:
                    invalid[d.id] = exc.message
                    continue
                problem = source_problem(models[d.model_id]) if self.check_sources else None
                if problem is not None:
                    invalid[d.id] = problem
                    continue
                entries.extend(render_serve_applications(spec))
        return rows, entries, invalid

    def _status(self) -> ServeStatus | None:
        try:
            return self.client.status()
        except errors.BatonError as exc:
            log.warning("reading Serve status failed: %s", exc.message)
            return None

    def _apply(self, config: dict[str, Any], before: ServeStatus) -> tuple[str | None, bool]:
        """PUTs the config with retries; returns the final error (None: accepted) and whether Serve
        rejected the config itself (no retry helps then)."""
        delay = self.backoff_s
        error = "not attempted"
        for attempt in range(1, self.attempts + 1):
            try:
                self.client.apply(config)
            except errors.BatonError as exc:
                error = str(exc.message)
                if exc.extra.get("rejected"):
                    self._audit_apply(config, before, attempt, error)
                    return error, True
                log.warning("Serve apply attempt %d/%d failed: %s", attempt, self.attempts, error)
                if attempt < self.attempts:
                    self.sleep(delay)
                    delay *= 2
                continue
            self._audit_apply(config, before, attempt, None)
            return None, False
        self._audit_apply(config, before, self.attempts, error)
        return error, False

    def _audit_apply(self, config: dict[str, Any], before: ServeStatus, attempts: int, error: str | None) -> None:
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
        with self.db.system() as uow:
            uow.audit.record(
                actor=ACTOR,
                action="serve.apply" if error is None else "serve.apply_failed",
                target_type="serve_config",
                target_id=digest,
                before={"applications": sorted(before.apps)},
                after=jsonable({"applications": [a["name"] for a in config["applications"]],
                                "attempts": attempts, "error": error}),
            )
            uow.commit()

    def _unreachable(self, rows: dict[uuid.UUID, _Row]) -> None:
        # Serve's state is unknown: never keep claiming "running".
        with self.db.system() as uow:
            for r in rows.values():
                if r.desired == "running" and r.observed in ("running", "deploying", "pending"):
                    self._write(uow, r, "unhealthy", "The Ray dashboard is unreachable.", None)
            uow.commit()

    def _observe(
        self,
        rows: dict[uuid.UUID, _Row],
        entries: list[dict[str, Any]],
        invalid: dict[uuid.UUID, str],
        status: ServeStatus,
        result: ReconcileResult,
        *,
        refused: dict[uuid.UUID, str] | None = None,
        rolled: dict[uuid.UUID, tuple[str, int]] | None = None,
    ) -> None:
        """Writes what Serve runs into the rows. ``refused``: rows whose new generation never reached Ray while
        Serve keeps running an earlier one (their state is that one's, the reason says why). ``rolled``: rows
        whose generation failed to start in Ray and whose last good generation was sent instead (the reason
        and that generation). A running row's entries become its last good ones; a row whose current
        generation Serve could not deploy is rolled back (:attr:`ReconcileResult.rolled_back`)."""
        refused = refused or {}
        rolled = rolled or {}
        by_name = {e["name"]: e for e in entries}
        state: str
        reason: str | None
        gen: int
        with self.db.system() as uow:
            for r in rows.values():
                # A row's applications: its own, and a P/D deployment's prefill pool.
                names = [n for n in (r.name + PREFILL_APP_SUFFIX, r.name) if n in by_name]
                apps = [status.apps.get(n) for n in names]
                present = [a for a in (status.apps.get(r.name), status.apps.get(r.name + PREFILL_APP_SUFFIX))
                           if a is not None]
                if r.id in invalid:
                    state, reason = "failed", invalid[r.id]
                    gen = r.observed_generation
                elif r.desired == "running":
                    if any(a is None for a in apps):
                        state = "deploying" if result.applied else "pending"
                        reason = f"apply failed: {result.apply_error}" if result.apply_error else None
                        if result.apply_rejected:
                            state = "failed"
                        gen = r.observed_generation
                    else:
                        running = [a for a in apps if a is not None]
                        state = max((APP_STATUS_TO_OBSERVED.get(a.status, "deploying") for a in running),
                                    key=_SEVERITY.index)
                        current = all(a.matches(by_name[n]) for n, a in zip(names, running, strict=True))
                        if current and r.id not in refused and r.id not in rolled:
                            if state == "running":
                                self._remember(uow, r, [by_name[n] for n in names])
                            elif state == "failed" and self._failed_to_start(uow, r, running):
                                result.rolled_back.append(r.name)
                        # a refused row's entries are what Serve ran before: its new generation does not run
                        gen = r.generation if current and r.id not in refused else r.observed_generation
                        if r.id in rolled:
                            gen = rolled[r.id][1]
                        reason = "; ".join(a.message for a in running if a.message) or None
                        if result.apply_error and not current:
                            # Serve still runs the older spec (observed_generation says which).
                            reason = f"apply failed: {result.apply_error}"
                            if result.apply_rejected:
                                state = "failed"
                        elif not current and state == "running" and r.id not in refused:
                            state = "deploying"
                        if r.id in refused:
                            reason = f"not applied, what Serve runs keeps serving: {refused[r.id]}"
                        if r.id in rolled:
                            reason = rolled[r.id][0]
                    result.states[r.name] = state
                elif present:  # stopped or deleted, but Serve still has it
                    state, reason, gen = "deploying", f"removing ({present[0].status.lower()})", r.observed_generation
                    if result.apply_error:
                        reason = f"apply failed: {result.apply_error}"
                    result.states[r.name] = state
                elif r.desired == "deleted":
                    self._remove(uow, r)
                    result.removed.append(r.name)
                    continue
                else:
                    state, reason, gen = "stopped", None, r.generation
                    result.states[r.name] = state
                self._write(uow, r, state, reason, gen)
            uow.commit()

    def _remember(self, uow: UnitOfWork, r: _Row, entries: list[dict[str, Any]]) -> None:
        """The row's current generation runs: it is the last good one (a failure of an older generation is
        history now)."""
        good = jsonable({"generation": r.generation, "applications": entries})
        if r.last_good != good:
            uow.deployments.write_memory(r.id, last_good=good)
        if r.failed_generation is not None:
            uow.deployments.write_memory(r.id, failed_generation=None, failed_reason=None)

    def _failed_to_start(self, uow: UnitOfWork, r: _Row, apps: list[Any]) -> bool:
        """Serve could not deploy the row's current generation: with an earlier generation seen running, that
        one is sent again (True). The row remembers the failure until its spec changes."""
        good = r.last_good
        if not good or good.get("generation") == r.generation or r.failed_generation == r.generation:
            return False
        why = "; ".join(a.message[:300] for a in apps if a.message) or "Serve could not deploy it"
        reason = (f"generation {r.generation} failed to start in Ray ({why}): generation {good['generation']}, "
                  "the last that ran, serves again; change the deployment to try another")
        uow.deployments.write_memory(r.id, failed_generation=r.generation, failed_reason=reason)
        uow.audit.record(actor=ACTOR, action="deployment.rolled_back", target_type="deployment",
                         target_id=str(r.id), before={"generation": r.generation},
                         after={"generation": good["generation"], "reason": reason})
        log.warning("deployment %s: %s", r.name, reason)
        return True

    def _write(self, uow: UnitOfWork, r: _Row, state: str, reason: str | None, gen: int | None) -> None:
        gen = r.observed_generation if gen is None else gen
        if (state, reason, gen) == (r.observed, r.reason, r.observed_generation):
            return
        uow.deployments.write_observed(r.id, state=m.ObservedState(state), reason=reason, generation=gen)
        if (state, gen) != (r.observed, r.observed_generation):
            uow.audit.record(
                actor=ACTOR, action="deployment.observed", target_type="deployment", target_id=str(r.id),
                before={"observed_state": r.observed, "observed_generation": r.observed_generation},
                after={"observed_state": state, "observed_generation": gen, "reason": reason},
            )

    def _remove(self, uow: UnitOfWork, r: _Row) -> None:
        uow.deployments.remove_deleted(r.id)
        uow.audit.record(
            actor=ACTOR, action="deployment.removed", target_type="deployment", target_id=str(r.id),
            before={"name": r.name, "observed_state": r.observed}, after=None,
        )


def _keep_last_good(rows: dict[uuid.UUID, _Row], invalid: dict[uuid.UUID, str], status: ServeStatus,
                    entries: list[dict[str, Any]]) -> set[uuid.UUID]:
    """For each invalid row that should run and whose applications Serve runs (from this reconciler's
    config), adds those applications as they run to ``entries``: the earlier generation keeps serving. The
    ids of those rows."""
    kept: set[uuid.UUID] = set()
    for row_id in invalid:
        r = rows[row_id]
        if r.desired != "running":
            continue
        running = [status.apps[n] for n in (r.name + PREFILL_APP_SUFFIX, r.name)
                   if n in status.apps and status.apps[n].managed and status.apps[n].config]
        if running and any(a.config.get("name") == r.name for a in running):
            entries.extend(dict(a.config) for a in running)
            kept.add(row_id)
    return kept


def _roll_back(rows: dict[uuid.UUID, _Row], invalid: dict[uuid.UUID, str],
               entries: list[dict[str, Any]]) -> dict[uuid.UUID, tuple[str, int]]:
    """For each row whose current generation failed to start in Ray, its rendered applications in
    ``entries`` are replaced by those of its last good generation. The rows' reasons and that generation."""
    rolled: dict[uuid.UUID, tuple[str, int]] = {}
    for r in rows.values():
        good = r.last_good
        if (r.desired != "running" or r.id in invalid or r.failed_generation != r.generation or not good
                or not good.get("applications")):
            continue
        names = {r.name, r.name + PREFILL_APP_SUFFIX}
        entries[:] = [e for e in entries if e["name"] not in names]
        entries.extend(dict(a) for a in good["applications"])
        rolled[r.id] = (r.failed_reason or f"generation {r.generation} failed to start in Ray", int(good["generation"]))
    return rolled


def _runs_exactly(status: ServeStatus, entries: list[dict[str, Any]]) -> bool:
    """Whether Serve's config-managed apps are exactly the entries: an app run with ``serve.run`` on the
    same cluster is someone else's (a ``PUT`` keeps it), and never makes a pass apply again."""
    if {name for name, app in status.apps.items() if app.managed} != {e["name"] for e in entries}:
        return False
    return all(status.apps[e["name"]].matches(e) for e in entries)

