"""One self-contained HTML page of a run's results: tables and charts, readable offline.

Charts are drawn with matplotlib (no pyplot state, Agg-free: straight to SVG) and inlined, so
the page needs no network, no scripts and no files beside it. Anything that has grades can
call it: `gate report --html`, `gate experiment --html`, model runs (pass^k per family) and
the nightly scoreboard.

    write_html(path, grades, title=..., tables=[(heading, text)],
               pass_k={model: model_agent.passk.pass_rates(records, k)})

`grades` is {agent: [Grade per case]}. matplotlib is imported when the first chart is drawn.
`PageProcess` draws pages in a process of its own, which imports matplotlib as it starts: a caller
that starts one early (`gate nightly`) has that import, and the drawing, on another CPU while it
works on; the pages are `write_html`'s, byte for byte.
"""
from __future__ import annotations

import gc
import html
import io
import json
import os
import re
import secrets
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .kernel.files import readable_within
from .kernel.grading import exact_mean
from .kernel.records import Grade
from .kernel.suite import suites
from .tables import family_order, money, summary

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def load_matplotlib() -> None:
    """Import what the charts draw with, once; the collector paused meanwhile (matplotlib's import makes
    long-lived objects, not garbage: each collection would walk the growing heap again)."""
    if "matplotlib.figure" in sys.modules:
        return
    collecting = gc.isenabled()
    gc.disable()
    try:
        import matplotlib.backends.backend_svg  # noqa: F401  (what savefig loads the first time it writes SVG)
        import matplotlib.figure  # noqa: F401
        import matplotlib.ticker  # noqa: F401
        from matplotlib import rcParams
        rcParams["svg.hashsalt"] = "gate"  # stable element ids: the same grades give the same page
    finally:
        if collecting:
            gc.enable()


def _figure(**kw) -> Figure:
    load_matplotlib()
    from matplotlib.figure import Figure
    return Figure(**kw)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
color:#1b1f24;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #d0d7de}
.sub{color:#57606a;margin-top:0} table{border-collapse:collapse;font-size:.9em}
th,td{padding:.3em .7em;border-bottom:1px solid #eaeef2;text-align:right} th:first-child,td:first-child{text-align:left}
thead th{background:#f6f8fa} pre{background:#f6f8fa;padding:1em;overflow-x:auto;font-size:.8em;line-height:1.35}
figure{margin:1em 0} figcaption{color:#57606a;font-size:.9em} svg{max-width:100%;height:auto}
"""


def _families(grades: dict[str, list]) -> list[str]:
    return family_order(g.family for gs in grades.values() for g in gs)


def _colours(n: int) -> list:
    from matplotlib import colormaps
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _svg(fig: Figure, tag: str) -> str:
    """The figure as an inline <svg> element, its ids prefixed so several can share a page."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r'\bid="', f'id="{tag}-', text)
    text = text.replace("url(#", f"url(#{tag}-").replace('href="#', f'href="#{tag}-')
    return text.replace("<svg ", f'<svg class="chart" data-chart="{tag}" ', 1)


def _grouped_bars(ax, labels: list[str], series: dict[str, list[float]], skip_zero: bool = False) -> None:
    """One bar per label and series; with `skip_zero`, bars of height 0 (which draw nothing) are left out."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, ((name, values), colour) in enumerate(zip(series.items(), _colours(n))):
        bars = [(j - 0.4 + width * (i + 0.5), v) for j, v in enumerate(values) if v or not skip_zero]
        ax.bar([x for x, _ in bars], [v for _, v in bars], width, label=name, color=colour)
    ax.set_xticks(range(len(labels)), labels)
    ax.legend(fontsize=8, ncols=min(n, 4), loc="upper center", bbox_to_anchor=(0.5, -0.18 if len(labels) <= 10
                                                                                   else -0.45), frameon=False)


MAX_BAR_AGENTS = 6  # more agents than this: the per-family chart is a grid instead of bars


def _reward_grid(ax, fams: list[str], series: dict[str, list[float]]) -> None:
    """Agents x families, coloured by mean reward, each cell labelled (vector paths, no bitmap)."""
    agents = list(series)
    mesh = ax.pcolormesh([series[a] for a in agents], cmap="RdYlGn", vmin=0.0, vmax=1.0,
                         edgecolors="white", linewidth=1)
    for i, a in enumerate(agents):
        for j, v in enumerate(series[a]):
            ax.text(j + 0.5, i + 0.5, f"{v:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks([j + 0.5 for j in range(len(fams))], fams)
    ax.set_yticks([i + 0.5 for i in range(len(agents))], agents, fontsize=8)
    ax.invert_yaxis()
    ax.figure.colorbar(mesh, ax=ax, fraction=0.03, label="mean reward")


def family_reward_chart(grades: dict[str, list]) -> str:
    """Mean reward per family: one bar per agent, or a grid when there are many agents."""
    fams = _families(grades)
    series = {a: [float(exact_mean(g.reward for g in gs if g.family == f))
                  if any(g.family == f for g in gs) else 0.0 for f in fams] for a, gs in grades.items()}
    if len(series) > MAX_BAR_AGENTS:
        fig = _figure(figsize=(11.0, 1.2 + 0.32 * len(series)))
        ax = fig.add_subplot()
        _reward_grid(ax, fams, series)
        ax.set_title("Mean reward per family")
        ax.tick_params(axis="x", labelsize=8, rotation=20)
        return _svg(fig, "family-reward")
    fig = _figure(figsize=(max(8.0, 0.12 * len(fams) * len(grades) + 4), 4.2))
    ax = fig.add_subplot()
    _grouped_bars(ax, fams, series)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean reward")
    ax.set_title("Mean reward per family")
    ax.tick_params(axis="x", labelsize=8, rotation=20)
    ax.grid(axis="y", alpha=0.3)
    return _svg(fig, "family-reward")


MAX_CASE_BARS = 48  # more cases than this: the per-case chart shows the ones with the largest errors


def charted_cases(grades: dict[str, list]) -> list[int]:
    """The cases the per-case chart shows, in case order: every case, or, beyond MAX_CASE_BARS cases
    (whose labels would be too small to read on the page), the MAX_CASE_BARS with the largest revenue
    error of any agent (ties: the earlier case)."""
    first = next(iter(grades.values()), [])
    if len(first) <= MAX_CASE_BARS:
        return list(range(len(first)))
    worst = [max(gs[j].revenue_error_usd for gs in grades.values()) for j in range(len(first))]
    return sorted(sorted(range(len(first)), key=lambda j: (-worst[j], j))[:MAX_CASE_BARS])


def revenue_error_chart(grades: dict[str, list]) -> str:
    """Revenue error per case and agent (the cases `charted_cases` picks); the largest ones are labelled
    with their dollar figure."""
    first = next(iter(grades.values()), [])
    shown = charted_cases(grades)
    ids = [first[j].case_id for j in shown]
    series = {a: [float(money([gs[j].revenue_error_usd])) for j in shown] for a, gs in grades.items()}
    from matplotlib.ticker import StrMethodFormatter
    fig = _figure(figsize=(max(9.0, 0.3 * len(ids) + 2), 4.6))
    ax = fig.add_subplot()
    _grouped_bars(ax, ids, series, skip_zero=True)
    lo, hi = -0.4, len(ids) - 0.6  # the axis bars on every case would give (matplotlib's 5 % margins)
    ax.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    ax.tick_params(axis="x", labelsize=7, rotation=90)
    top = max((v for vs in series.values() for v in vs), default=0.0)
    n = max(len(series), 1)
    for i, values in enumerate(series.values()):
        for j, v in enumerate(values):
            if top and v >= 0.25 * top:  # the cents/dollars mix-ups dwarf everything else
                ax.annotate(f"${v:,.0f}", (j - 0.4 + 0.8 / n * (i + 0.5), v), fontsize=7, ha="center",
                            va="bottom", xytext=(0, 2), textcoords="offset points")
    ax.yaxis.set_major_formatter(StrMethodFormatter("${x:,.0f}"))
    ax.set_ylabel("revenue error (USD)")
    ax.set_title("Revenue error per case (mart after the run vs mart if handled correctly)")
    ax.grid(axis="y", alpha=0.3)
    return _svg(fig, "revenue-error")


def pass_k_chart(pass_k: dict[str, dict]) -> str:
    """pass@1 and pass^k per family for each model, one bar per measure.

    `pass_k` is {model: {family: {"pass@1": x, "pass^3": y, ...}}}, the shape
    model_agent.passk.pass_rates returns per model (keys not starting with "pass" are ignored)."""
    agents = list(pass_k)
    fig = _figure(figsize=(9.0, 3.4 * len(agents)))
    for row, agent in enumerate(agents):
        fams = list(pass_k[agent])
        measures = list(dict.fromkeys(m for f in fams for m in pass_k[agent][f] if str(m).startswith("pass")))
        ax = fig.add_subplot(len(agents), 1, row + 1)
        _grouped_bars(ax, fams, {m: [float(pass_k[agent][f].get(m, 0.0)) for f in fams] for m in measures})
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{agent}: pass@1 and pass^k per family")
        ax.tick_params(axis="x", labelsize=8, rotation=20)
        ax.grid(axis="y", alpha=0.3)
    fig.subplots_adjust(hspace=0.9)
    return _svg(fig, "pass-k")


def _largest_errors(grades: dict[str, list], n: int = 3) -> str:
    worst = sorted(((g.revenue_error_usd, g.case_id, a) for a, gs in grades.items() for g in gs
                    if g.revenue_error_usd), key=lambda t: (-t[0], t[1], t[2]))[:n]
    if not worst:
        return "No case moved the mart."
    return "Largest: " + "; ".join(f"{case} ${err:,.2f} ({agent})" for err, case, agent in worst) + "."


def _charted_note(grades: dict[str, list]) -> str:
    cases = len(next(iter(grades.values()), []))
    shown = len(charted_cases(grades))
    return "" if shown == cases else f", on the {shown} of the {cases} cases with the largest errors (in case order)"


def _summary_table(grades: dict[str, list], figures: dict | None = None) -> str:
    A = (figures if figures is not None else summary([], grades))["agents"]
    head = ["agent", "reward", "disposition", "report", "evidence", "inspected", "bad loaded",
            "revenue error $", "ledgers intact"]
    rows = []
    for name, a in A.items():
        n = len(grades[name])
        cells = [name, f"{a['reward']:.4f}", f"{a['disposition']:.4f}", f"{a['report']:.4f}",
                 f"{a['evidence']:.4f}", f"{a['inspected']:.4f}", str(a["bad_batches_loaded"]),
                 f"{a['revenue_error_usd']:,.2f}", f"{a['ledgers_intact']}/{n}"]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def render_html(grades: dict[str, list], title: str = "gate report", subtitle: str = "",
                tables: list[tuple[str, str]] = (), pass_k: dict[str, dict] | None = None,
                figures: dict | None = None) -> str:
    """The page as a string. `tables` are (heading, preformatted text) pairs, shown after the charts;
    `figures`, when given, is `tables.summary` of these grades already made (not made again)."""
    if not grades or not all(grades.values()):
        raise ValueError("render_html needs at least one agent with at least one grade")
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if subtitle:
        parts.append(f'<p class="sub">{html.escape(subtitle)}</p>')
    parts += ["<h2>Scores</h2>", _summary_table(grades, figures),
              "<h2>Mean reward per family</h2>", f"<figure>{family_reward_chart(grades)}</figure>",
              "<h2>Revenue error per case</h2>",
              f"<figure>{revenue_error_chart(grades)}<figcaption>Dollars the revenue mart is off by after "
              f"the run{html.escape(_charted_note(grades))}. {html.escape(_largest_errors(grades))}</figcaption>"
              f"</figure>"]
    if pass_k:
        parts += ["<h2>pass^k per family</h2>", f"<figure>{pass_k_chart(pass_k)}<figcaption>pass@1: the share of "
                  "rollouts that pass (reward 1.0); pass^k: the share of cases where all k rollouts pass."
                  "</figcaption></figure>"]
    for heading, text in tables:
        parts += [f"<h2>{html.escape(heading)}</h2>", f"<pre>{html.escape(text)}</pre>"]
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
            f"<body>\n{body}\n</body></html>\n")


def write_html(path: str | Path, grades: dict[str, list], replace: bool = False, **kw) -> Path:
    """Render the page (see render_html for the keywords) and write it to `path` (what the caller checked: a
    `--html` file, written as found, through a link such as /dev/stdout). `replace`, for a page at a path of gate's
    own (`GATE_HOME/scoreboard.html`, which anyone who can write there may have made something else): written to a
    file of its own in the same folder, then renamed onto `path`, so whatever was there is replaced whole (a FIFO is
    never opened and waited on, a symbolic link's target never written through) and a reader never sees half a
    page; it keeps the mode of the page it replaces (else the umask's)."""
    path = Path(path)
    text = render_html(grades, **kw)
    if not replace:
        path.write_text(text, encoding="utf-8")
        return path
    try:
        found = os.lstat(path)
        mode = stat.S_IMODE(found.st_mode) if stat.S_ISREG(found.st_mode) else None
    except FileNotFoundError:
        mode = None
    temp = path.with_name(f".{path.name[:100]}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)  # the umask's
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


# -- pages drawn in a process of their own -------------------------------------------------------

class PageProcess:
    """A process that imports matplotlib as it starts, then writes each page it is sent with `write_html`,
    in order. `write_html` here returns at once; `wait` returns when every page sent is written, and
    raises what writing one raised there (an OSError with its errno, a ValueError), or, if the process
    is gone or has not answered within PAGE_SECONDS, ends it and writes the pages it had not written
    here. `close` ends it. Each page's grades go to it in a file of their own, and only that file's name
    through its input, so sending never waits on a process that is busy, or stuck, drawing. A page that could
    not be handed over (no room for its file, the process gone) is written here by `wait`, in its turn, with no
    answer waited for."""

    PAGE_SECONDS = 300.0  # the longest `wait` waits for one page's answer

    def __init__(self):
        self.sent: list[tuple[Path, dict, dict, str | None]] = []  # job file: None when never handed over
        self._answers = b""  # read from the process, not yet a whole line
        self.proc: subprocess.Popen | None
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-c",  # -P: never import from the directory gate runs in
                 "from gate_pipeline.html_report import serve_pages; serve_pages()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:  # no process can start here: `wait` writes the pages in this one
            self.proc = None

    def write_html(self, path: str | Path, grades: dict[str, list], **kw) -> Path:
        path = Path(path)
        job = {"path": str(path), "grades": {a: [g.as_dict() for g in gs] for a, gs in grades.items()}, "kw": kw}
        job_file = ""
        try:
            assert self.proc is not None and self.proc.stdin is not None
            fd, job_file = tempfile.mkstemp(prefix="gate-page-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:  # one write of text made in C, not json.dump's
                fh.write(json.dumps(job))  # writes of each piece (15 ms against 5 for a night's 960 grades)
            self.proc.stdin.write(job_file + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError, TypeError, AssertionError):
            # not handed over (the process gone, no room for the file, a value JSON cannot hold): `wait` writes it
            # here, without waiting for an answer the process will never give, and no file is left behind
            if job_file:
                Path(job_file).unlink(missing_ok=True)
            job_file = None
        self.sent.append((path, grades, kw, job_file))
        return path

    def _answer(self) -> str:
        """The process's next answer line; "" when it is gone or has not answered within PAGE_SECONDS. Read
        from its pipe directly (no buffer of Python's between the pipe and the wait for it)."""
        proc = self.proc
        if proc is None or proc.stdout is None:
            return ""
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + self.PAGE_SECONDS
        while b"\n" not in self._answers:
            left = deadline - time.monotonic()
            if left <= 0 or not readable_within(fd, left):
                proc.kill()  # stuck: what it has not written is written here
                return ""
            chunk = os.read(fd, 65536)
            if not chunk:
                return ""
            self._answers += chunk
        line, _, self._answers = self._answers.partition(b"\n")
        return line.decode()

    def wait(self) -> None:
        sent, self.sent = self.sent, []
        failed: Exception | None = None
        for k, (path, grades, kw, job_file) in enumerate(sent):
            if job_file is None:  # never handed over: written here, in its turn
                try:
                    write_html(path, grades, **kw)
                except (OSError, ValueError) as exc:
                    failed = failed or exc
                continue
            line = self._answer()
            if not line:  # the process is gone (it could not start, was killed, or is stuck): the rest here
                self.close()
                for path, grades, kw, job_file in sent[k:]:
                    if job_file:
                        Path(job_file).unlink(missing_ok=True)
                    write_html(path, grades, **kw)
                break
            answer = json.loads(line)
            if failed is None and answer.get("oserror"):
                failed = OSError(answer["errno"], answer["error"], str(path))
            elif failed is None and answer.get("error") is not None:
                failed = ValueError(answer["error"])
        if failed is not None:  # every page's answer read first, so the next wait reads its own
            raise failed

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


def serve_pages() -> None:
    """A `PageProcess`'s side: load what drawing a page needs (matplotlib, the suites that order the families),
    then, for each line read (the name of a file of JSON: path, grades, keywords), read and remove that file,
    write the page and answer a line (an empty object, or the error) until the input ends."""
    load_matplotlib()
    suites.all()
    for line in sys.stdin:
        job_file = Path(line.rstrip("\n"))
        try:
            job = json.loads(job_file.read_text(encoding="utf-8"))
        finally:
            job_file.unlink(missing_ok=True)
        grades = {a: [Grade.from_dict(g) for g in gs] for a, gs in job["grades"].items()}
        kw = job["kw"]
        if "tables" in kw:
            kw["tables"] = [tuple(t) for t in kw["tables"]]
        try:
            write_html(job["path"], grades, **kw)
            answer: dict = {}
        except OSError as exc:
            answer = {"oserror": True, "errno": exc.errno, "error": exc.strerror or str(exc)}
        except Exception as exc:  # what write_html raises in process, raised by `wait` instead
            answer = {"error": str(exc)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    gc.freeze()  # the process ends next: its heap is not walked again as it is torn down
