"""The README says what gate does, and only what it does: at most 250 lines; every `$ ` command in
it runs here and prints what the README shows; every Python example runs (and prints the text
block that follows it, when there is one); the agent it shows is the example file; every link
resolves inside the repository (the docs' too).

A command's shown output must match its stdout line for line; a last line `...` means the README
shows only the beginning. Commands without `$ ` (the set-up lines, a model run against a live
server) are not run here: tests/test_install.py and the model tests cover them."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 250
FENCE = re.compile(r"^```(\w*)\s*$")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def blocks(text: str) -> list[tuple[str, str, int, int]]:
    """(language, body, line of the opening fence, line of the closing fence) for every fenced block."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            out.append((m.group(1), "\n".join(lines[i + 1:j]), i, j))
            i = j
        i += 1
    return out


def shell_examples(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) for every `$ ` line of a bash block."""
    out = []
    for lang, body, _, _ in blocks(text):
        current = None
        for line in body.splitlines() if lang == "bash" else []:
            if line.startswith("$ "):
                current = (line[2:], [])
                out.append(current)
            elif current is not None:
                current[1].append(line)
    return out


def python_examples(text: str) -> list[tuple[str, str | None]]:
    """(code, the output shown in a ```text block right after it, or None)."""
    lines, found, out = text.splitlines(), blocks(text), []
    for k, (lang, body, _, end) in enumerate(found):
        if lang != "python":
            continue
        after = found[k + 1] if k + 1 < len(found) else None
        adjacent = after is not None and after[0] == "text" and not "".join(lines[end + 1:after[2]]).strip()
        out.append((body, after[1] if adjacent else None))
    return out


def readme_env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `.venv/bin` on PATH
    env["GATE_HOME"] = str(tmp_path / "gate")
    env["COLUMNS"] = "100"
    return env


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= MAX_LINES


SHELL = shell_examples(README.read_text())


def test_the_readme_has_shell_examples_to_check():
    assert [c for c, _ in SHELL] == ["gate report", "gate attacks",
                                     "PYTHONPATH=examples gate report --agents naive,my_agent:AmountCheck,careful",
                                     "gate report --cases cases/v2/eval_curated.jsonl --agents oracle,careful-v2,"
                                     "careful,naive,refuse-all",
                                     "gate attacks --cases cases/v2/eval_curated.jsonl --agents careful-v2,obey-data,"
                                     "clean-night"]


@pytest.mark.parametrize("command,shown", SHELL, ids=[c for c, _ in SHELL])
def test_every_readme_command_prints_what_the_readme_shows(command, shown, tmp_path):
    run = subprocess.run(["bash", "-c", command], cwd=ROOT, env=readme_env(tmp_path), capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr
    printed = [line.rstrip() for line in run.stdout.rstrip("\n").splitlines()]
    shown = [line.rstrip() for line in shown]
    while shown and not shown[-1]:
        shown.pop()
    if shown and shown[-1] == "...":
        assert printed[:len(shown) - 1] == shown[:-1]
        assert len(printed) > len(shown) - 1  # there is more, as the README says
    else:
        assert printed == shown


PYTHON = python_examples(README.read_text())


@pytest.mark.parametrize("code,shown", PYTHON, ids=[f"python-{i}" for i in range(len(PYTHON))])
def test_every_readme_python_example_runs(code, shown, tmp_path):
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=readme_env(tmp_path), capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    if shown is not None:
        assert run.stdout.rstrip("\n") == shown.rstrip("\n")


def code_lines(text):
    """The code without its blank lines (the README spaces its example more tightly than the file)."""
    return "\n".join(line for line in text.splitlines() if line.strip())


def test_the_readme_shows_an_example_that_prints_and_one_agent_of_the_examples_folder():
    assert sum(shown is not None for _, shown in PYTHON) >= 1
    agent = next(code for code, _ in PYTHON if "class AmountCheck" in code)
    assert code_lines(agent) in code_lines((ROOT / "examples" / "my_agent.py").read_text())


@pytest.mark.parametrize("doc", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_link_resolves_inside_the_repository(doc):
    bad = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path = target.split("#", 1)[0]
        if not path:
            continue
        resolved = (doc.parent / path).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            bad.append(target)
    assert bad == []
    assert "../shared" not in doc.read_text()
