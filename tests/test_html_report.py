"""The HTML report: self-contained, and its charts really render in headless Chromium."""
import re
import subprocess
from pathlib import Path

import pytest
from servers import SETUP

from gate_pipeline.cli.main import main
from gate_pipeline.html_report import render_html, write_html
from gate_pipeline.kernel.cases import read_cases
from gate_pipeline.kernel.engine import play_cases

CASES = Path(__file__).resolve().parent.parent / "cases" / "classic" / "eval_curated.jsonl"
CHROMIUM = SETUP.PACKAGES["chromium"].found()
NO_CHROMIUM = SETUP.PACKAGES["chromium"].skip_reason()


@pytest.fixture(scope="module")
def grades():
    played = play_cases(read_cases(CASES), ["naive", "careful"])
    return {agent: [r.grade for r in results] for agent, results in played.items()}


def test_page_is_self_contained(grades):
    page = render_html(grades, title="t <&>", tables=[("Tables", "a < b")],
                       pass_k={"model-x": {"amount-bounds": {"cases": 4, "pass@1": 0.75, "pass^3": 0.5},
                                           "all": {"cases": 4, "pass@1": 0.75, "pass^3": 0.5}}})
    assert page.count('<svg class="chart"') == 3
    assert "<script" not in page and "<link" not in page and "<img" not in page
    assert not re.search(r'(src|href)="(https?:|//)', page)  # nothing fetched from anywhere
    assert "t &lt;&amp;&gt;" in page and "a &lt; b" in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))  # three SVGs, no id shared between them


def test_many_agents_get_a_grid_instead_of_bars(grades):
    many = {f"agent-{i}": grades["naive" if i % 2 else "careful"] for i in range(7)}
    page = render_html(many)
    assert 'id="family-reward-QuadMesh_1"' in page  # the agents x families grid
    assert 'id="family-reward-QuadMesh_1"' not in render_html(grades)  # two agents: bars
    assert all(f">agent-{i}<" in page for i in range(7))


def test_same_grades_same_page(grades):
    assert render_html(grades) == render_html(grades)


def test_no_grades_is_refused():
    with pytest.raises(ValueError):
        render_html({})


def test_report_html_flag_errors(tmp_path, capsys):
    assert main(["report", "--html", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["report", "--reward", "dense", "--html", str(tmp_path / "x.html")]) == 2
    assert "drop --reward dense" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    return subprocess.run(
        [CHROMIUM, "--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120)


def _pixels_near(png: Path, rgb: tuple[int, int, int], tol: int = 6) -> int:
    from matplotlib.image import imread
    img = (imread(png)[:, :, :3] * 255).round()
    return int((abs(img - rgb).max(axis=2) <= tol).sum())


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_charts_render_in_headless_chromium(tmp_path, capsys):
    page = tmp_path / "report.html"
    assert main(["report", "--cases", str(CASES), "--agents", "naive,careful", "--html", str(page)]) == 0
    capsys.readouterr()

    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    charts = re.findall(r'<svg class="chart" data-chart="([^"]+)"', dom.stdout)
    assert charts == ["family-reward", "revenue-error"]
    assert dom.stdout.count("<path") > 100  # bars, axes, glyphs parsed into the DOM

    shot = tmp_path / "report.png"
    run = _chromium(tmp_path, "--window-size=1280,2200", f"--screenshot={shot}", page.as_uri())
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    blue, orange = (31, 119, 180), (255, 127, 14)  # matplotlib tab10: naive, careful
    # naive's bars: 8 families and the revenue-error bars; careful's: 8 families at 1.0
    assert _pixels_near(shot, blue) > 5000
    assert _pixels_near(shot, orange) > 5000
    from matplotlib.image import imread
    assert imread(shot).shape[:2] == (2200, 1280)


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_pass_k_chart_renders_in_headless_chromium(tmp_path, grades):
    pass_k = {"model-x": {"amount-bounds": {"cases": 4, "pass@1": 0.75, "pass^3": 0.5},
                          "all": {"cases": 4, "pass@1": 0.75, "pass^3": 0.5}}}
    page = write_html(tmp_path / "model.html", grades, title="model run", pass_k=pass_k)
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert re.findall(r'<svg class="chart" data-chart="([^"]+)"', dom.stdout) == [
        "family-reward", "revenue-error", "pass-k"]
    # the axes background plus one bar per (family, measure): 2 families x (pass@1, pass^3)
    assert len(re.findall(r'id="pass-k-patch_\d+"', dom.stdout)) >= 1 + 2 * 2


def test_a_big_night_charts_the_cases_with_the_largest_revenue_errors(grades):
    """Beyond MAX_CASE_BARS cases the per-case chart's labels would be too small to read: it shows the cases
    with the largest error of any agent, in case order, and the caption says how many of how many."""
    import dataclasses

    from gate_pipeline.html_report import MAX_CASE_BARS, charted_cases
    n = MAX_CASE_BARS + 20
    big = {a: [dataclasses.replace(gs[k % len(gs)], case_id=f"case-{k:03d}") for k in range(n)]
           for a, gs in grades.items()}
    shown = charted_cases(big)
    worst = [max(gs[j].revenue_error_usd for gs in big.values()) for j in range(n)]
    assert len(shown) == MAX_CASE_BARS and shown == sorted(shown)
    assert min(worst[j] for j in shown) >= max(worst[j] for j in range(n) if j not in shown)
    page = render_html(big)
    assert f"on the {MAX_CASE_BARS} of the {n} cases with the largest errors" in page
    assert all(f"case-{j:03d}" in page for j in shown)  # the tick labels (matplotlib's SVG names each text)
    assert not any(f"case-{j:03d}" in page for j in range(n) if j not in shown)
    assert charted_cases(grades) == list(range(len(grades["naive"])))  # 32 cases: every one
    assert "cases with the largest errors" not in render_html(grades)


def test_a_page_process_writes_the_pages_write_html_writes(grades, tmp_path):
    """Pages drawn by a `PageProcess` (matplotlib imported there, not here) are write_html's, byte for byte, in
    the order sent; one that cannot be written raises the OSError writing it raised; a process that is gone
    leaves its pages to be written here."""
    import errno

    from gate_pipeline.html_report import PageProcess
    kw = {"title": "night", "subtitle": "night 3: naive, careful", "tables": [("Tables", "a < b")]}
    write_html(tmp_path / "here.html", grades, **kw)
    pages = PageProcess()
    try:
        assert pages.write_html(tmp_path / "there.html", grades, **kw) == tmp_path / "there.html"
        pages.write_html(tmp_path / "there-too.html", grades, title="another")
        pages.wait()
        assert (tmp_path / "there.html").read_bytes() == (tmp_path / "here.html").read_bytes()
        assert (tmp_path / "there-too.html").read_bytes() == render_html(grades, title="another").encode()
        pages.write_html(tmp_path / "no-such-folder" / "page.html", grades)
        pages.write_html(tmp_path / "after.html", grades, **kw)
        with pytest.raises(OSError) as raised:
            pages.wait()
        assert raised.value.errno == errno.ENOENT and raised.value.filename == str(tmp_path / "no-such-folder" /
                                                                                    "page.html")
        assert (tmp_path / "after.html").read_bytes() == (tmp_path / "here.html").read_bytes()  # written all the same
        assert pages.proc is not None
        pages.proc.kill()  # gone (killed, or it could not start): what it was sent is written here
        pages.proc.wait()
        pages.write_html(tmp_path / "here-again.html", grades, **kw)
        pages.wait()
        assert (tmp_path / "here-again.html").read_bytes() == (tmp_path / "here.html").read_bytes()
    finally:
        pages.close()
    assert pages.proc is None


def test_a_page_process_imports_nothing_from_the_directory_gate_runs_in(grades, tmp_path, monkeypatch):
    """The process is started with the interpreter's safe path: a module named like one it imports, in the
    folder `gate nightly` runs from, is never imported (here it would leave a file behind)."""
    from gate_pipeline.html_report import PageProcess
    marker = tmp_path / "imported"
    for name in ("json", "subprocess", "matplotlib"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    monkeypatch.chdir(tmp_path)
    pages = PageProcess()
    try:
        pages.write_html(tmp_path / "page.html", grades, title="night")
        pages.wait()
    finally:
        pages.close()
    assert not marker.exists()
    assert (tmp_path / "page.html").read_bytes() == render_html(grades, title="night").encode()


def test_a_page_process_that_is_stuck_never_holds_the_caller(grades, tmp_path, monkeypatch):
    """A page process that stops answering (here: stopped by a signal, mid-night) costs the caller at most
    PAGE_SECONDS: sending never waits on it (each page's grades go in a file of its own, however many
    episodes), `wait` ends it and writes the pages here, and no file handed to it is left behind."""
    import signal
    import tempfile
    import time

    from gate_pipeline.html_report import PageProcess
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(jobs))
    many = {agent: gs * 40 for agent, gs in grades.items()}  # far more than a pipe holds
    pages = PageProcess()
    pages.PAGE_SECONDS = 2.0
    try:
        pages.write_html(tmp_path / "first.html", grades, title="night")
        pages.wait()  # drawn there: the process is up
        assert pages.proc is not None
        pages.proc.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        pages.write_html(tmp_path / "stuck.html", many, title="night")
        pages.write_html(tmp_path / "stuck-too.html", many, title="night 2")
        assert time.monotonic() - start < 1.0
        pages.wait()
        assert time.monotonic() - start < 10.0 and pages.proc is None
    finally:
        pages.close()
    assert (tmp_path / "stuck.html").read_bytes() == render_html(many, title="night").encode()
    assert (tmp_path / "stuck-too.html").read_bytes() == render_html(many, title="night 2").encode()
    assert (tmp_path / "first.html").read_bytes() == render_html(grades, title="night").encode()
    assert not list(jobs.iterdir())


def test_a_page_the_process_was_never_handed_is_written_here_at_once(grades, tmp_path, monkeypatch):
    """A page whose file could not be made (no room in the temporary folder) was still waited for: `wait` took the
    next page's answer for it, so it was never written, and then waited PAGE_SECONDS for an answer the process
    never gives and ended the process. Now it is written here in its turn, at once, and the process stays up."""
    import errno
    import tempfile
    import time

    from gate_pipeline.html_report import PageProcess
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(jobs))
    made = tempfile.mkstemp

    def no_room(*args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    pages = PageProcess()
    pages.PAGE_SECONDS = 20.0
    try:
        pages.write_html(tmp_path / "first.html", grades, title="night 1")
        monkeypatch.setattr(tempfile, "mkstemp", no_room)
        pages.write_html(tmp_path / "second.html", grades, title="night 2")  # not handed over
        monkeypatch.setattr(tempfile, "mkstemp", made)
        pages.write_html(tmp_path / "third.html", grades, title="night 3")
        start = time.monotonic()
        pages.wait()
        assert time.monotonic() - start < 10.0
        assert pages.proc is not None and pages.proc.poll() is None  # still up for the next night's page
    finally:
        pages.close()
    for n in (1, 2, 3):
        page = ("first", "second", "third")[n - 1]
        assert (tmp_path / f"{page}.html").read_bytes() == render_html(grades, title=f"night {n}").encode()
    assert not list(jobs.iterdir())


def test_a_page_replaces_whatever_is_at_its_path_at_once_never_writing_through_it(tmp_path, grades):
    """`GATE_HOME/scoreboard.html` was opened and written as found: a FIFO there held `gate nightly` (and the
    Dagster job) for ever, and a symbolic link there had its target overwritten. The scoreboard's page is now written
    beside its path and renamed onto it: what was there is replaced whole, and a reader never sees half a page."""
    import os
    import threading
    fifo, link, victim = tmp_path / "fifo.html", tmp_path / "link.html", tmp_path / "victim.txt"
    os.mkfifo(fifo)
    victim.write_text("keep me")
    link.symlink_to(victim)
    for path in (fifo, link):
        done = threading.Event()
        worker = threading.Thread(target=lambda p=path, d=done: (write_html(p, grades, title="t", replace=True),
                                                                 d.set()), daemon=True)
        worker.start()
        assert done.wait(30), f"writing {path.name} waited"
        assert path.is_file() and not path.is_symlink() and path.read_text().startswith("<!DOCTYPE html>")
    assert victim.read_text() == "keep me"
    (tmp_path / "fifo.html").chmod(0o600)  # a page replaced keeps the mode it had; a new one gets the umask's
    write_html(tmp_path / "fifo.html", grades, title="t", replace=True)
    assert (tmp_path / "fifo.html").stat().st_mode & 0o777 == 0o600
    old = os.umask(0o027)
    try:
        write_html(tmp_path / "new.html", grades, title="t", replace=True)
    finally:
        os.umask(old)
    assert (tmp_path / "new.html").stat().st_mode & 0o777 == 0o640
    (tmp_path / "new.html").unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.html", "link.html", "victim.txt"]  # no temp left


def test_an_html_flag_page_is_written_through_what_the_caller_checked(tmp_path, grades):
    """`--html /dev/null` or `/dev/stdout` (what `output_file` lets through) is written as found: renamed onto its
    path, the page replaced the device, or the link, with a file (as root). Shown through a link, so the test never
    puts /dev/null at risk."""
    import os
    link = tmp_path / "null.html"
    link.symlink_to(os.devnull)
    write_html(link, grades, title="t")
    assert link.is_symlink() and os.readlink(link) == os.devnull and list(tmp_path.iterdir()) == [link]
