"""House rules of the layout: one `baton` namespace, no `platform` package, layers point downwards."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
LAYERS = ["baton.core", "baton.dataplane", "baton.control", "baton.api", "baton.bench", "baton.cli"]


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGE_DIR.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_platform_folder_is_not_a_package() -> None:
    assert not (ROOT / "platform" / "__init__.py").exists()


def test_stdlib_platform_still_imports_from_the_repository_root() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import platform; print(platform.system(), platform.__file__)"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    assert str(ROOT / "platform") not in out
    assert out.split()[0] in {"Linux", "Darwin", "Windows"}


def test_every_package_folder_is_listed_in_pyproject() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    for pkg, folder in PACKAGE_DIR.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            assert ".".join([pkg, *rel]) in listed, f"{init} is not in pyproject's packages"


def test_lower_layers_never_import_higher_ones() -> None:
    for module, path in _modules().items():
        layer = next(i for i, name in enumerate(LAYERS) if module == name or module.startswith(name + "."))
        for imported in _imports(path):
            for higher in LAYERS[layer + 1:]:
                assert not (imported == higher or imported.startswith(higher + ".")), (
                    f"{module} imports {imported}, a higher layer"
                )


def test_only_the_dataplane_imports_the_engine() -> None:
    for module, path in _modules().items():
        if module.startswith("baton.dataplane"):
            continue
        for imported in _imports(path):
            assert not imported.startswith(("vllm", "ray.serve.llm", "lmcache", "nixl")), (
                f"{module} imports {imported}"
            )


#: Loaded only inside Ray Serve replicas and engine processes (by Ray's import paths and vLLM's
#: `kv_connector_module_path`): they subclass Ray's, vLLM's and LMCache's classes, so importing them
#: imports the engine by nature. Nothing else may.
ENGINE_PLUGINS = {"baton.dataplane.engine", "baton.dataplane.kv_connector", "baton.dataplane.kv_integrity",
                  "baton.dataplane.kv_trace",
                  "baton.dataplane.lmcache_cpu", "baton.dataplane.pd", "baton.bench.chaos.kv_faults"}


def test_importing_baton_builds_nothing_heavy() -> None:
    modules = [m for m in _modules() if not m.endswith("__main__") and m not in ENGINE_PLUGINS]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "heavy = sorted(n for n in ('torch', 'vllm', 'ray', 'lmcache', 'nixl') if n in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"imported at import time: {out.stdout.strip()}"


def _dependencies(path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``baton`` modules ``path`` imports, inside functions too (a deferred import is still a
    dependency), leaving out imports under ``if TYPE_CHECKING:``; ``from pkg import sub`` counts both."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found & modules.keys()


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_in_the_baton_namespace() -> None:
    modules = _modules()
    graph = {name: _dependencies(path, modules) - {name} for name, path in modules.items()}
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_deferred_import(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text("from baton.x import b\n")
    b.write_text("def f():\n    import baton.x.a\n")
    c.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import baton.x.a\n")
    modules = {"baton.x.a": a, "baton.x.b": b, "baton.x.c": c, "baton.x": tmp_path / "none.py"}
    graph = {name: _dependencies(path, modules) - {name} for name, path in modules.items() if path.exists()}
    assert import_cycles(graph) == [["baton.x.a", "baton.x.b"]]


#: Layers whose imports sit at the top of the module; one inside a function says why it waits
#: (``# deferred: ...`` on its line or on the comment and import lines just above it). The data plane
#: defers Ray, vLLM and LMCache by rule (only replicas load them), the CLI and the benches every command's
#: parts (so that ``baton --help`` starts at once).
TOP_IMPORTS = ("baton.core", "baton.control", "baton.api")


def deferred_without_reason(path: Path) -> list[int]:
    """Lines of imports inside functions of ``path`` that no ``deferred`` comment explains."""
    lines = path.read_text().splitlines()
    out = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            i = node.lineno - 1
            said = "# deferred" in lines[i]
            while not said and i > 0 and lines[i - 1].strip().startswith(("#", "import ", "from ")):
                i -= 1
                said = "# deferred" in lines[i]
            if not said:
                out.append(node.lineno)
    return sorted(set(out))


def test_imports_inside_functions_say_why_they_wait() -> None:
    found = {name: lines for name, path in _modules().items() if name.startswith(TOP_IMPORTS)
             if (lines := deferred_without_reason(path))}
    assert found == {}


def test_an_unexplained_import_inside_a_function_is_found(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f():\n    import json\n\n\ndef g():\n    # deferred: heavy\n    import json\n"
                    "    from os import path\n\n\ndef h():\n    import json  # deferred: heavy\n")
    assert deferred_without_reason(path) == [2]
