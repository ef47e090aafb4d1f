"""The study report: tables read from printed text, the page built from executed notebooks, and the
page as Chromium renders it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from grpo_knobs import report
from grpo_knobs.cli import main
from grpo_knobs.study import ANALYSIS_NOTEBOOKS, run_analysis

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_STUDY = ROOT / "results" / "h200-mini"
SYNTHETIC_STUDY = ROOT / "tests" / "fixtures" / "synthetic_study"
NOTEBOOKS = ROOT / "lib" / "grpo_knobs" / "notebooks"


# --- tables from printed text -------------------------------------------------------------------
@pytest.mark.parametrize(
    "frame",
    [
        pd.DataFrame({"task": ["gsm8k", "countdown-2x10"], "val_pct": ["2.34", "62.00"], "seed": ["1", "12"]}),
        # headers and cells with spaces; a single row, so every blank position lines up
        pd.DataFrame(
            {
                "Comparison": ["onpolicy-large versus onpolicy-small"],
                "Mean pp": ["-0.03"],
                "Conditional 95% interval": ["[-0.58, +0.56]"],
                "Seed differences pp": ["+0.15, -0.15, -0.08"],
            }
        ),
        # the same multi-word cell in every row, under a one-word header
        pd.DataFrame({"recipe": ["a", "bb"], "responses": ["0/1 reached; 1 not reached by 8,192 responses"] * 2}),
        pd.DataFrame({"x": ["n/a", "1"], "long header name": ["", "y"]}).iloc[1:],
    ],
)
def test_printed_frames_are_read_back_cell_for_cell(frame):
    lines = frame.to_string(index=False).split("\n")
    table = report.parse_text_table(lines)
    assert table is not None
    assert table.columns == list(frame.columns)
    assert table.rows == frame.astype(str).values.tolist()


@pytest.mark.parametrize(
    "text",
    [
        "study reference: loaded\nnothing here is a table",
        "a  b\n1  2\n3",  # ragged lines
        "only   one   line",
        "left   right\nx        ",  # last column blank on a row
    ],
)
def test_text_that_is_not_a_printed_frame_stays_preformatted(text):
    assert report.parse_text_table(text.split("\n")) is None
    out = report.text_output_html(text)
    assert "<table" not in out and "<pre" in out


def test_printed_tables_match_the_markdown_files_the_notebook_wrote():
    """Notebook 51 prints each per-run table and writes the same one to figures/*.md."""
    nb = nbformat.read(NOTEBOOKS / "51_confirmation.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "confirmation_run_table" in c.source)
    text = "".join(o["text"] for o in cell.outputs if o.get("output_type") == "stream")
    blocks = [b.split("\n") for b in re.split(r"\n\s*\n", text.strip("\n"))]
    parsed = [report.parse_text_table(b) for b in blocks]
    assert len(parsed) == 2 and all(parsed)
    for table in parsed:
        task = table.rows[0][0]
        _, written = report.parse_markdown_table((ROOT / "figures" / f"confirmation_runs_{task}.md").read_text())
        assert (table.columns, table.rows) == (written.columns, written.rows)


def test_markdown_tables_keep_their_note_and_escaped_pipes():
    note, table = report.parse_markdown_table("**Synthetic records**\n\n| a | b |\n| --- | --- |\n| x \\| y | 2 |\n")
    assert note == "Synthetic records"
    assert table.columns == ["a", "b"] and table.rows == [["x | y", "2"]]
    assert report.parse_markdown_table("| a | b |\n| x | y |\n") is None


def test_a_notebook_page_hides_code_and_keeps_split_prints_together(tmp_path):
    """Kernels may deliver one print as several stream messages; errors stay visible."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 59 · Example\n\nWhat it shows.\n\n## Numbers"),
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            "print(table)",
            outputs=[
                nbformat.v4.new_output("stream", name="stdout", text="countdown | Sizes\n"),
                nbformat.v4.new_output("stream", name="stdout", text="  arm  P\nsmall 16\nlarge  4\n"),
            ],
        ),
        nbformat.v4.new_code_cell(
            "1 / 0",
            outputs=[
                nbformat.v4.new_output(
                    "error",
                    ename="ZeroDivisionError",
                    evalue="division by zero",
                    traceback=["\x1b[31mZeroDivisionError\x1b[0m: division by zero"],
                ),
            ],
        ),
    ]
    path = tmp_path / "59_example.ipynb"
    nbformat.write(nb, path)
    page = report._Page()
    out = report.notebook_html(path, tmp_path, page)
    assert [(e.level, e.text) for e in page.toc] == [(2, "59 · Example"), (3, "Numbers")]
    assert '<h2 id="59-example">' in out and '<h3 id="numbers">' in out
    assert "x = 1" not in out and "print(table)" not in out and "1 / 0" not in out
    assert '<pre class="out caption-text">countdown | Sizes</pre>' in out
    assert "<td>small</td><td class=num>16</td>" in out
    assert '<pre class="out error">ZeroDivisionError: division by zero</pre>' in out


# --- the page ------------------------------------------------------------------------------------
class _Page(HTMLParser):
    """What a reader's browser would fetch, and the ids and links of the page."""

    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[str] = []
        self.images: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "img":
            self.images.append(a["src"])
        if tag in ("script", "img", "iframe", "audio", "video", "source", "embed") and a.get("src"):
            self.fetched.append(a["src"])
        if tag == "link" and a.get("href"):
            self.fetched.append(a["href"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])


@pytest.fixture(scope="module")
def committed_report(tmp_path_factory) -> Path:
    return report.write_report(COMMITTED_STUDY, tmp_path_factory.mktemp("report") / "report.html")


def _image_outputs(nb_path: Path) -> int:
    nb = nbformat.read(nb_path, as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_committed_study_report_is_self_contained(committed_report):
    text = committed_report.read_text()
    page = _Page()
    page.feed(text)
    assert all(src.startswith("data:") for src in page.fetched), [
        s[:60] for s in page.fetched if not s.startswith("data:")
    ]
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "@import" not in text and "url(http" not in text
    assert len(page.images) == sum(_image_outputs(NOTEBOOKS / f"{n}.ipynb") for n in ANALYSIS_NOTEBOOKS)
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    # every contents entry lands on a heading, one per notebook at least
    internal = [h[1:] for h in page.links if h.startswith("#")]
    assert internal and set(internal) <= page.ids
    for name in ANALYSIS_NOTEBOOKS:
        title = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4).cells[0].source.splitlines()[0]
        assert title.lstrip("# ").split(" · ")[1] in text
    # no code: the notebooks' imports and parameter cells are not on the page
    assert "import sys" not in text and "study_dir =" not in text
    assert "<strong>h200-mini</strong>" in text and "Report generated" in text


def test_committed_study_report_tables_and_long_outputs(committed_report):
    text = committed_report.read_text()
    sections = dict(re.findall(r'<section class="notebook" data-notebook="([^"]+)">(.*?)</section>', text, re.DOTALL))
    assert list(sections) == list(ANALYSIS_NOTEBOOKS)
    # 52 prints two long cells: collapsed, and still rendered as tables inside
    long = re.findall(r"<details class=long>(.*?)</details>", sections["52_time_to_target"], re.DOTALL)
    assert len(long) == 2 and all('<table class="sortable">' in d for d in long)
    # 51's per-run table is an HTML table with the seeds as cells
    assert re.search(r"<th scope=\"col\" tabindex=\"0\" class=num>test_pct</th>", sections["51_confirmation"])
    # the Markdown tables each notebook wrote are listed under it
    assert "<code>confirmation_comparisons_countdown-2x10.md</code>" in sections["51_confirmation"]
    assert "<code>screening_all.md</code>" in sections["55_screening"]
    assert "<code>confirmation_runs_gsm8k.md</code>" not in sections["55_screening"]
    assert text.count('<table class="sortable">') > 40


def test_report_of_a_study_analyzed_with_grpo_knobs(tmp_path, capsys):
    """A user's study: `analyze` writes executed notebooks into STUDY_DIR/figures; `report` finds them."""
    study = tmp_path / "study"
    shutil.copytree(SYNTHETIC_STUDY, study)
    run_analysis(study, notebooks=["51_confirmation"], progress=False)
    assert main(["report", str(study)]) == 0
    out = study / "figures" / "report.html"
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"report: {out}"
    text = out.read_text()
    assert 'data-notebook="51_confirmation"' in text and 'data-notebook="50_learning_curves"' not in text
    assert "Paired test comparisons" in text and '<table class="sortable">' in text
    assert "Notebooks executed" in text  # papermill's end time, kept in the executed copy
    assert "injected-parameters" not in text and "study_dir =" not in text
    # the notebook names the study it ran on, from its records, not the committed one
    assert f"records in {study}; 37 complete runs of synthetic-model" in text


def test_report_without_executed_notebooks_says_what_to_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"grpo-knobs analyze {tmp_path}" in err
    assert main(["report", str(tmp_path / "missing")]) != 0
    assert "no study directory" in capsys.readouterr().err


# --- in a browser --------------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (Debian: apt-get install chromium)")
def test_report_in_headless_chromium(committed_report, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install -e '.[test]')")
    errors: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 1000},
        )
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(committed_report.as_uri(), wait_until="load")
            images = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.complete, i.naturalWidth])")
            assert len(images) >= 10 and all(done and width > 0 for done, width in images), images

            # 51's per-run table: sort by test accuracy, then reverse
            table = page.locator("section[data-notebook='51_confirmation'] table.sortable").nth(1)
            header = table.locator("thead th", has_text="test_pct")
            col = int(header.evaluate("th => th.cellIndex"))
            column = f"t => Array.from(t.tBodies[0].rows, r => parseFloat(r.cells[{col}].textContent))"
            before = table.evaluate(column)
            assert before != sorted(before)
            header.click()
            assert table.evaluate(column) == sorted(before)
            assert header.get_attribute("aria-sort") == "ascending"
            header.click()
            assert table.evaluate(column) == sorted(before, reverse=True)

            # a collapsed long output opens
            details = page.locator("details.long").first
            details.locator("summary").click()
            assert details.evaluate("d => d.open")
            page.locator("#contents").scroll_into_view_if_needed()
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    assert not errors, errors
    assert all(u.startswith(("file:", "data:")) for u in requests), [u for u in requests if u.startswith("http")]
    assert shot.stat().st_size > 10_000


# --- a crafted notebook ---------------------------------------------------------------------------
ATTACKS = (
    "<script>alert('markdown script')</script>\n\n"
    "<img src=x onerror=\"alert('markdown img')\">\n\n"
    "[markdown link](javascript:alert(1)) and <a href=\"JaVaScRiPt:alert('raw link')\">raw link</a>\n\n"
    "<iframe src=\"javascript:alert('iframe')\"></iframe><svg onload=\"alert('svg')\"></svg>\n\n"
    "<details open ontoggle=\"alert('toggle')\"><summary>details</summary>body</details>\n\n"
    "<form action=\"javascript:alert('form')\"><button>send</button></form>"
    '<a href="#crafted" onclick="alert(\'onclick\')">an anchor</a>'
)


def _crafted_notebook(folder: Path) -> Path:
    """An executed notebook under an analysis notebook's name whose outputs try to run script in the page."""
    nb = nbformat.v4.new_notebook()
    display = nbformat.v4.new_output
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Crafted\n\n" + ATTACKS),
        nbformat.v4.new_code_cell(
            "show()",
            outputs=[
                display("display_data", data={"text/markdown": "## From an output\n\n" + ATTACKS}),
                display("display_data", data={"image/png": "iVBORw0KGgo=\" onerror=\"alert('png')", "text/plain": ""}),
                display("display_data", data={"image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg' "
                                              "onload=\"alert('svg image')\"><script>alert('svg')</script></svg>"}),
                display("display_data", data={"text/html": "<script>alert('html output')</script>",
                                              "text/plain": "<script>alert('plain text')</script>"}),
                display("stream", name="stdout", text="<img src=x onerror=\"alert('stream')\">\n"),
                display("error", ename="Error", evalue="<img src=x onerror=alert('error')>", traceback=[]),
            ],
        ),
    ]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{ANALYSIS_NOTEBOOKS[0]}.ipynb"
    nbformat.write(nb, path)
    return path


def test_a_crafted_notebook_is_sanitised(tmp_path):
    _crafted_notebook(tmp_path / "notebooks")
    (tmp_path / "study").mkdir()
    out = tmp_path / "report.html"
    args = ["report", str(tmp_path / "study"), "--notebooks", str(tmp_path / "notebooks"), "--out", str(out)]
    assert main(args) == 0
    page = _Page()
    text = out.read_text()
    page.feed(text)
    assert page.tags.count("script") == 1  # the report's own table-sorting script
    assert not {"iframe", "svg", "form", "button"} & set(page.tags)
    assert not re.search(r"<[^>]+\son\w+\s*=", text), "an event handler attribute reached the page"
    assert not re.search(r"(href|src|action)\s*=\s*[\"']?\s*javascript:", text, re.IGNORECASE)
    assert all(src.startswith("data:") for src in page.fetched)  # nothing from outside the page
    assert len(page.images) == 1 and page.images[0].startswith("data:image/svg+xml;base64,")  # inert in an img
    assert "an image output that is not base64, left out" in text
    assert 'href="#crafted"' in text and "<h2 " in text  # what is safe is kept


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (Debian: apt-get install chromium)")
def test_a_crafted_notebook_runs_no_script_in_chromium(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install -e '.[test]')")
    _crafted_notebook(tmp_path / "notebooks")
    (tmp_path / "study").mkdir()
    out = tmp_path / "report.html"
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_knobs.cli", "report", str(tmp_path / "study"), "--notebooks",
         str(tmp_path / "notebooks"), "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    dialogs: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            page = browser.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(out.as_uri(), wait_until="load")
            for link in page.locator("main a").all():  # a javascript: link would run when clicked
                link.click()
            page.locator("details summary").first.click()
            page.wait_for_timeout(500)
            handlers = page.evaluate(
                "Array.from(document.querySelectorAll('*')).flatMap(e => Array.from(e.attributes)"
                ".filter(a => a.name.startsWith('on') || /^\\s*javascript:/i.test(a.value)).map(a => a.name))"
            )
            scripts = page.evaluate("document.scripts.length")
        finally:
            browser.close()
    assert dialogs == [] and handlers == [] and scripts == 1  # the report's own sorting script
