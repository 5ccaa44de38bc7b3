"""The layering gate documents (docs/architecture.md): a kernel that knows no suite; suites as plug-ins, each
in its own folder with the same files, none importing another; the generic agents, the report services, the
run store, then model runs, the integrations, the Dagster project and the command line on top, never the
reverse; no module imports another that imports it back (function-level imports included)."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gate_pipeline"
SERVICES = ("tables", "experiments", "html_report")
TOP = ("model_agent", "integrations", "dagster_defs", "cli")
FRAMEWORKS = ("dagster", "gymnasium", "verifiers", "openai", "sqlalchemy", "openenv", "fastapi", "uvicorn", "starlette")
# layer -> the layers of gate it may import
ALLOWED = {
    "kernel": {"kernel"},
    "suite": {"kernel"},  # and its own folder (checked apart)
    "agents": {"kernel", "agents"},
    "services": {"kernel", "services"},
    "store": {"kernel", "services", "store"},
    "model_agent": {"kernel", "services", "store", "model_agent"},
    "integrations": {"kernel", "services", "store", "model_agent", "integrations"},
    "dagster_defs": {"kernel", "services", "store", "dagster_defs"},
    "cli": {"kernel", "services", "store", "model_agent", "integrations", "dagster_defs", "cli"},
    "root": {"integrations"},  # the package registers the gymnasium env when gymnasium is loaded
}
# the files every suite's folder has (docs/architecture.md, "Adding a suite")
SUITE_FILES = ("__init__.py", "contract.py", "cases.py", "generator.py", "world.py", "tools.py", "grader.py",
               "rules.py", "schemas.py", "gold.py", "findings.py", "agents.py", "attackers.py", "prompt.py")


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
    parts = module.split(".")
    first = parts[1] if len(parts) > 1 else ""
    if module == "gate_pipeline":
        return "root"
    if first == "suites":
        return "suite" if len(parts) > 2 else "suites-doc"
    if first in ("store", "verify"):
        return "store"
    if first in SERVICES:
        return "services"
    return first if first in (*TOP, "kernel", "agents") else "other"


def suite_of_module(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "suites" else None


def test_every_module_has_a_layer():
    assert [m for m in graph() if layer(m) == "other"] == []


def test_no_layer_imports_what_it_may_not():
    bad = []
    for module, targets in graph().items():
        mine = layer(module)
        for target in targets:
            theirs = layer(target)
            if mine == "suite" and suite_of_module(target) == suite_of_module(module):
                continue
            if target == "gate_pipeline":  # the package root: its __version__
                continue
            if mine != "suites-doc" and theirs not in ALLOWED.get(mine, set()):
                bad.append(f"{module} -> {target}")
    assert bad == []


def test_the_kernel_imports_no_suite_and_no_suite_imports_another():
    g = graph()
    kernel = [f"{m} -> {t}" for m, ts in g.items() if layer(m) == "kernel" for t in ts if layer(t) != "kernel"]
    across = [f"{m} -> {t}" for m, ts in g.items() if layer(m) == "suite" for t in ts
              if layer(t) == "suite" and suite_of_module(t) != suite_of_module(m)]
    assert kernel == [] and across == []


def test_every_suite_folder_has_the_same_files():
    folders = [p for p in (PACKAGE / "suites").iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    assert len(folders) >= 2
    for folder in folders:
        assert [f for f in SUITE_FILES if not (folder / f).is_file()] == [], folder.name


def test_no_module_outside_the_suites_names_a_suite():
    """No suite's name as a string, and no import of a suite, outside gate_pipeline/suites/."""
    names = sorted(p.name for p in (PACKAGE / "suites").iterdir() if p.is_dir() and (p / "__init__.py").exists())
    quoted = re.compile("|".join(rf"(['\"]){re.escape(n)}\1" for n in names) + r"|suite_v2")
    bad = []
    for path in PACKAGE.rglob("*.py"):
        if (PACKAGE / "suites") in path.parents:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if quoted.search(line):
                bad.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
        bad += [f"{path.relative_to(PACKAGE)}: imports {i}" for i in imports(path) if i.startswith("gate_pipeline.suites")]
    assert bad == []


def test_the_kernel_suites_agents_and_store_import_no_framework():
    bad = []
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        if layer(module) in ("kernel", "suite", "agents", "services", "store"):
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


def test_the_kernel_and_suites_import_no_dagster_when_loaded():
    modules = [m for m in graph() if layer(m) in ("kernel", "suite", "agents", "store")]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'gymnasium', 'verifiers', 'openenv')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_cli_starts_without_pandas_pandera_dagster_or_openenv():
    code = ("import sys, gate_pipeline.cli.main\n"
            "gate_pipeline.cli.main.build_parser()  # imports every subcommand module\n"
            "from gate_pipeline.kernel.suite import suites; suites.all()  # and loads every suite\n"
            "print(sorted(m for m in ('pandas', 'pandera', 'dagster', 'openai', 'openenv', 'fastapi', 'uvicorn')\n"
            "             if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-1000:]
