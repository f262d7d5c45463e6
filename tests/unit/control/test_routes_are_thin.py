"""The catalogue and SLO routes are adapters over the control plane's use cases: none opens a unit of
work, and no console module imports a module of admin routes."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

from baton.api.admin import deployments, models, slo


def test_admin_catalogue_and_slo_routes_open_no_unit_of_work() -> None:
    for mod in (models, deployments, slo):
        tree = ast.parse(inspect.getsource(mod))
        opened = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "system"]
        assert not opened, f"{mod.__name__} opens a unit of work at lines {opened}"


def test_no_console_module_imports_an_admin_route_module() -> None:
    """The console reaches the use cases through the control plane and shares only the admin API's
    schemas, conversions and helpers: no module of ``baton.api.console`` imports a module that holds
    admin routes (so no console route can call one)."""
    admin_pkg = importlib.import_module("baton.api.admin")
    route_modules = {
        f"baton.api.admin.{info.name}" for info in pkgutil.iter_modules(admin_pkg.__path__)
        if hasattr(importlib.import_module(f"baton.api.admin.{info.name}"), "router")
    }
    assert {"baton.api.admin.models", "baton.api.admin.deployments", "baton.api.admin.slo"} <= route_modules
    console_pkg = importlib.import_module("baton.api.console")
    found = []
    for info in pkgutil.iter_modules(console_pkg.__path__):
        mod = importlib.import_module(f"baton.api.console.{info.name}")
        for n in ast.walk(ast.parse(inspect.getsource(mod))):
            if isinstance(n, ast.ImportFrom) and n.module:
                names = {n.module} | {f"{n.module}.{a.name}" for a in n.names}
            elif isinstance(n, ast.Import):
                names = {a.name for a in n.names}
            else:
                continue
            found += [f"{info.name}: {x}" for x in sorted(names & route_modules)]
    assert not found, f"console modules import admin route modules: {found}"
