"""The layering gate documents (README, Layout): the core plays and grades episodes and imports no
framework; the run store sits on the core; model runs, the integrations, the Dagster project and
the command line sit on top and never the reverse; no module imports another that imports it back."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gate_pipeline"
CORE = ("records", "actions", "contract", "rules", "settings", "cases", "generator", "world", "sandbox", "ledger",
        "tools", "grader", "rewards", "gold", "schemas", "tables", "variants", "agents", "engine", "experiments",
        "html_report", "suites", "suite_v2")
TOP = ("model_agent", "integrations", "dagster_defs", "cli")
FRAMEWORKS = ("dagster", "gymnasium", "verifiers", "openai", "sqlalchemy", "openenv", "fastapi", "uvicorn", "starlette")
# layer -> packages of gate it must not import (by any import, at module level or inside a function)
FORBIDDEN = {
    "core": ("store", *TOP),
    "store": TOP,
    "model_agent": ("integrations", "dagster_defs", "cli"),
    "integrations": ("dagster_defs", "cli"),
    "dagster_defs": ("integrations", "cli"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it, as absolute names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)  # `from . import x` may import module x
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {i for i in imports(p) if i in files and i != name} for name, p in files.items()}


def layer(module: str) -> str:
    first = module.split(".")[1] if "." in module else ""
    if first in ("store", "verify"):
        return "store"
    return first if first in TOP else "core" if first in CORE else "other"


def test_every_module_has_a_layer():
    assert [m for m in graph() if layer(m) == "other" and m != "gate_pipeline"] == []


def test_no_layer_imports_what_sits_above_it():
    bad = []
    for module, targets in graph().items():
        for target in targets:
            if target.partition(".")[2].split(".")[0] in FORBIDDEN.get(layer(module), ()):
                bad.append(f"{module} -> {target}")
    assert bad == []


def test_the_core_and_the_store_import_no_framework():
    bad = []
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        if layer(module) in ("core", "store"):
            allowed = ("sqlalchemy",) if layer(module) == "store" else ()
            bad += [f"{module} -> {i}" for i in imports(path)
                    if i.split(".")[0] in FRAMEWORKS and i.split(".")[0] not in allowed]
    assert bad == []


def test_no_import_cycles():
    g = graph()
    g.pop("gate_pipeline", None)  # the package root only registers the gymnasium env when gymnasium is loaded
    state: dict[str, int] = {}
    cycles = []

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_core_imports_no_dagster_when_loaded():
    modules = [m for m in graph() if layer(m) in ("core", "store")]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'gymnasium', 'verifiers', 'openenv')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_cli_starts_without_pandas_pandera_dagster_or_openenv():
    code = ("import sys, gate_pipeline.cli.main\n"
            "gate_pipeline.cli.main.build_parser()  # imports every subcommand module\n"
            "print(sorted(m for m in ('pandas', 'pandera', 'dagster', 'openai', 'openenv', 'fastapi', 'uvicorn')\n"
            "             if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-1000:]
