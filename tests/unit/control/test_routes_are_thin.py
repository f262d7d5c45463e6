"""The catalogue and SLO routes are adapters over the control plane's use cases: none opens a unit of
work, and no console route calls an admin route."""

from __future__ import annotations

import ast
import inspect

from baton.api.admin import deployments, models, slo
from baton.api.console import operator


def _endpoints(*modules: object) -> set[str]:
    return {r.endpoint.__name__ for mod in modules for r in mod.router.routes}  # type: ignore[attr-defined]


def test_admin_catalogue_and_slo_routes_open_no_unit_of_work() -> None:
    for mod in (models, deployments, slo):
        tree = ast.parse(inspect.getsource(mod))
        opened = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "system"]
        assert not opened, f"{mod.__name__} opens a unit of work at lines {opened}"


def test_console_operator_routes_call_no_admin_route() -> None:
    routes = _endpoints(models, deployments, slo)
    tree = ast.parse(inspect.getsource(operator))
    calls = [
        f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
        and n.func.value.id in ("admin_models", "admin_deployments", "admin_slo") and n.func.attr in routes
    ]
    assert not calls, f"console operator routes call admin routes: {calls}"
