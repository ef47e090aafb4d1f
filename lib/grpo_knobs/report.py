"""One self-contained HTML page from a study's executed analysis notebooks (50-56).

The page has no code, no external assets and no scripts from the network: figures are
embedded as base64 images, printed tables become HTML tables whose columns sort on click
(a small inline script), and every Markdown table a notebook wrote beside its figures is
listed under that notebook. Text that does not parse as a table stays preformatted, and
long outputs are collapsed.

Where the executed notebooks are:

- ``grpo-knobs analyze STUDY_DIR`` (and ``grpo-knobs study``) write them to ``STUDY_DIR/figures``;
- the committed ``grpo_knobs/notebooks/5*.ipynb`` are executed on the study named by their
  ``study_dir`` parameter (``results/h200-mini``) and write ``figures/``.
"""

from __future__ import annotations

import ast
import base64
import datetime as dt
import html
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .locations import NOTEBOOKS, checkout_root, project_relative
from .provenance import git_commit
from .study.notebooks import ANALYSIS_NOTEBOOKS, PREREGISTERED_NOTEBOOKS

# A text output longer than this is collapsed (notebook 52 prints about 8,500 characters per cell).
LONG_OUTPUT_CHARS = 4000
REPORT_NAME = "report.html"


@dataclass(frozen=True)
class ReportSources:
    """Where a report's inputs are."""

    study_dir: Path  # the study's run folders (and plan.json)
    notebooks: tuple[Path, ...]  # the executed analysis notebooks, in reading order
    tables_dir: Path  # where those notebooks wrote their figures and Markdown tables


@dataclass(frozen=True)
class TocEntry:
    level: int  # 2 for a notebook, 3 for a section inside it
    anchor: str  # the heading's id
    text: str  # plain heading text


@dataclass
class TextTable:
    """A table read from text: column names and rows of display strings."""

    columns: list[str]
    rows: list[list[str]]


@dataclass
class _Page:
    toc: list[TocEntry] = field(default_factory=list)
    ids: Counter = field(default_factory=Counter)

    def anchor(self, text: str) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
        self.ids[slug] += 1
        return slug if self.ids[slug] == 1 else f"{slug}-{self.ids[slug]}"


# ---------------------------------------------------------------------------------------------
# Finding the inputs


def committed_study_dir() -> Path | None:
    """The study the committed analysis notebooks read (their ``study_dir`` parameter); None outside a checkout."""
    notebook, root = NOTEBOOKS / f"{ANALYSIS_NOTEBOOKS[0]}.ipynb", checkout_root()
    if root is None or not notebook.is_file():
        return None
    return (root / _notebook_parameter(notebook, "study_dir")).resolve()


def _notebook_parameter(path: Path, name: str) -> Any:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                    return ast.literal_eval(node.value)
    raise ValueError(f"{path} has no parameter {name!r} in its parameters cell")


def find_sources(study_dir: str | Path, notebooks_dir: str | Path | None = None) -> ReportSources:
    """The executed notebooks of ``study_dir``: ``notebooks_dir`` if given, else ``study_dir/figures``,
    else the committed notebooks when ``study_dir`` is the study they read."""
    study = Path(study_dir).resolve()
    if not study.is_dir():
        raise FileNotFoundError(f"no study directory at {study_dir}; pass a folder of run directories")
    if notebooks_dir is not None:
        candidates = [Path(notebooks_dir).resolve()]
    else:
        candidates = [study / "figures"]
        if study == committed_study_dir():
            candidates.append(NOTEBOOKS)
    for folder in candidates:
        # The committed 59 reads its own study (results/seeds20), not the one the committed 50-57 read.
        names = ANALYSIS_NOTEBOOKS + (PREREGISTERED_NOTEBOOKS if folder != NOTEBOOKS else ())
        found = tuple(folder / f"{name}.ipynb" for name in names if (folder / f"{name}.ipynb").is_file())
        if found:
            tables = folder
            if folder == NOTEBOOKS:
                tables = (checkout_root() / _notebook_parameter(found[0], "out_dir")).resolve()
            return ReportSources(study, found, tables)
    where = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"no executed analysis notebooks (50_*.ipynb .. 56_*.ipynb) in {where}; "
        f"run `grpo-knobs analyze {study_dir}` first"
    )


# ---------------------------------------------------------------------------------------------
# Tables from text


def parse_text_table(lines: list[str]) -> TextTable | None:
    """Read a table printed by ``DataFrame.to_string(index=False)``, or None.

    Columns are separated by character positions that are blank on every line. Cells and
    headers may contain spaces ("Mean pp", "split-8 versus batch-256"): a column slice that
    is blank on some line is joined to its right neighbour, since pandas right-aligns. The
    result is kept only if pandas prints it back as exactly ``lines``.
    """
    import pandas as pd

    if len(lines) < 2 or len({len(line) for line in lines}) != 1:
        return None
    width = len(lines[0])
    blank = [all(line[i] == " " for line in lines) for i in range(width)]
    spans: list[tuple[int, int]] = []
    start = None
    for i, is_blank in enumerate([*blank, True]):
        if not is_blank and start is None:
            start = i
        elif is_blank and start is not None:
            spans.append((start, i))
            start = None
    merged: list[tuple[int, int]] = []
    for span in spans:
        if merged and any(not line[merged[-1][0] : merged[-1][1]].strip() for line in lines):
            merged[-1] = (merged[-1][0], span[1])
        else:
            merged.append(span)
    if len(merged) < 2 or any(not line[merged[-1][0] : merged[-1][1]].strip() for line in lines):
        return None
    # Each cell runs from the end of the previous column, so right-aligned text is whole.
    bounds = [(0 if k == 0 else merged[k - 1][1], end) for k, (_, end) in enumerate(merged)]
    cells = [[line[a:b].strip() for a, b in bounds] for line in lines]
    table = TextTable(columns=cells[0], rows=cells[1:])
    frame = pd.DataFrame(table.rows, columns=pd.Index(table.columns, dtype=object))
    if frame.to_string(index=False).split("\n") != lines:
        return None
    return table


def parse_markdown_table(text: str) -> tuple[str | None, TextTable] | None:
    """A pipe table as written by ``analysis.write_table``: an optional bold note, then the table."""
    lines = [line.strip() for line in text.strip().splitlines()]
    note = None
    if lines and lines[0].startswith("**") and lines[0].endswith("**"):
        note = lines[0].strip("*")
    rows = [line for line in lines if line.startswith("|") and line.endswith("|")]
    if len(rows) < 2 or not re.fullmatch(r"\|( *:?-+:? *\|)+", rows[1]):
        return None

    def split(line: str) -> list[str]:
        return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line[1:-1])]

    columns = split(rows[0])
    body = [split(r) for r in rows[2:]]
    if any(len(r) != len(columns) for r in body):
        return None
    return note, TextTable(columns, body)


# ---------------------------------------------------------------------------------------------
# HTML pieces

_NUMBER = re.compile(r"^[+-]?(\d[\d,]*)?\.?\d+(e[+-]?\d+)?%?$", re.IGNORECASE)
_MISSING = {"", "n/a", "nan", "none", "-"}


def _is_numeric_column(values: Iterable[str]) -> bool:
    present = [v for v in values if v.lower() not in _MISSING]
    return bool(present) and all(_NUMBER.match(v) for v in present)


def table_html(table: TextTable, caption: str | None = None) -> str:
    numeric = [_is_numeric_column(row[k] for row in table.rows) for k in range(len(table.columns))]
    head = "".join(
        f'<th scope="col" tabindex="0"{" class=num" if num else ""}>{html.escape(c)}</th>'
        for c, num in zip(table.columns, numeric)
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=num' if num else ''}>{html.escape(v)}</td>" for v, num in zip(row, numeric))
        + "</tr>"
        for row in table.rows
    )
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (
        f'<div class="table-wrap"><table class="sortable">{cap}<thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _pre(text: str, cls: str = "out") -> str:
    return f'<pre class="{cls}">{html.escape(text)}</pre>'


def text_output_html(text: str) -> str:
    """Printed text as HTML: blocks separated by blank lines; a block whose last lines parse as a
    table becomes its caption lines and a table, anything else stays preformatted."""
    parts = []
    for block in re.split(r"\n\s*\n", text.strip("\n")):
        lines = block.rstrip().split("\n")
        for k in range(len(lines) - 1):
            table = parse_text_table(lines[k:])
            if table is not None:
                if k:
                    parts.append(_pre("\n".join(lines[:k]), "out caption-text"))
                parts.append(table_html(table))
                break
        else:
            parts.append(_pre(block.strip("\n")))
    return "\n".join(parts)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def output_html(output: Any, figure_label: str) -> tuple[str, int]:
    """One notebook output as HTML, and its length in characters of text (for collapsing)."""
    kind = output.get("output_type")
    if kind == "stream":
        return text_output_html(output["text"]), len(output["text"])
    if kind == "error":
        text = _ANSI.sub(
            "", "\n".join(output.get("traceback", [])) or f"{output.get('ename')}: {output.get('evalue')}"
        )
        return _pre(text, "out error"), len(text)
    data = output.get("data", {})
    if "image/png" in data:
        b64 = "".join(str(data["image/png"]).split())
        if not _BASE64.fullmatch(b64):  # anything else could close the attribute and add its own
            return f"<p class=note>{html.escape(figure_label)}: an image output that is not base64, left out</p>", 0
        return f'<figure><img alt="{html.escape(figure_label)}" src="data:image/png;base64,{b64}"></figure>', 0
    if "image/svg+xml" in data:
        svg = base64.b64encode(data["image/svg+xml"].encode()).decode()
        return f'<figure><img alt="{html.escape(figure_label)}" src="data:image/svg+xml;base64,{svg}"></figure>', 0
    if "text/markdown" in data:
        return _markdown(data["text/markdown"]), 0
    if "text/plain" in data:
        return text_output_html(data["text/plain"]), len(data["text/plain"])
    return "", 0


_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
# What a notebook's Markdown may put on the page: text structure, tables, code, links. No script,
# no event handlers, no frames, forms, styles or images (figures come from image outputs), and
# links only to this page (#...), the web or mail: the report is meant to be shared.
_MARKDOWN_TAGS = frozenset(
    "a abbr b blockquote br code dd del details div dl dt em h1 h2 h3 h4 h5 h6 hr i kbd li ol p pre s "
    "span strong sub summary sup table tbody td tfoot th thead tr ul".split()
)
_MARKDOWN_ATTRIBUTES = {
    "a": ["href", "title", "class"],
    **{f"h{n}": ["id"] for n in range(1, 7)},
    "th": ["style", "align"],
    "td": ["style", "align"],
    "div": ["class"],
    "span": ["class"],
    "code": ["class"],
}


def _markdown(source: str) -> str:
    """Markdown (a cell, or a ``text/markdown`` output) as sanitised HTML: raw HTML in it is reduced to
    :data:`_MARKDOWN_TAGS`, so a crafted notebook runs no script in the page."""
    import bleach  # nbconvert's own sanitiser (SanitizeHTML) is built on it
    from bleach.css_sanitizer import CSSSanitizer
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    return bleach.clean(
        markdown2html_mistune(str(source)),
        tags=_MARKDOWN_TAGS,
        attributes=_MARKDOWN_ATTRIBUTES,
        protocols={"http", "https", "mailto"},
        css_sanitizer=CSSSanitizer(allowed_css_properties=["text-align"]),
        strip=True,
        strip_comments=True,
    )


_HEADING = re.compile(r'<h([1-6])(?: id="[^"]*")?>(.*?)(?:<a class="anchor-link"[^>]*>[^<]*</a>)?</h\1>', re.DOTALL)


def _headings_shifted(fragment: str, page: _Page) -> str:
    """Notebook headings one level down (the page's title is the only h1), with unique ids in the contents."""

    def repl(m: re.Match) -> str:
        level = min(int(m.group(1)) + 1, 6)
        inner = m.group(2)
        text = html.unescape(re.sub(r"<[^>]+>", "", inner)).strip()
        anchor = page.anchor(text)
        if level <= 3:
            page.toc.append(TocEntry(level, anchor, text))
        return f'<h{level} id="{anchor}">{inner}</h{level}>'

    return _HEADING.sub(repl, fragment)


def _written_tables(nb: Any, tables_dir: Path) -> list[Path]:
    """The Markdown tables in ``tables_dir`` whose names a code cell passes to ``write_table``."""
    patterns = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for m in re.finditer(r"write_table\([^,]+,\s*\w+,\s*f?([\"'])(.+?)\1", cell.source):
            parts = re.split(r"\{[^}]*\}", m.group(2))
            patterns.append(re.compile(".+".join(re.escape(p) for p in parts) + r"\.md"))
    return sorted(p for p in tables_dir.glob("*.md") if any(pat.fullmatch(p.name) for pat in patterns))


def notebook_html(path: Path, tables_dir: Path, page: _Page) -> str:
    import nbformat
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    # Consecutive prints to one stream as one output: how a kernel splits them into messages
    # depends on flush timing, and a table's caption may arrive apart from the table.
    nb, _ = CoalesceStreamsPreprocessor().preprocess(nbformat.read(path, as_version=4), {})
    parts = []
    titled = False
    figures = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            fragment = _markdown(cell.source)
            if not titled and _HEADING.search(fragment):
                titled = True
            parts.append(_headings_shifted(fragment, page))
            continue
        if cell.cell_type != "code" or "parameters" in cell.metadata.get("tags", []):
            continue
        rendered, chars = [], 0
        for output in cell.get("outputs", []):
            if output.get("output_type") in ("display_data", "execute_result") and (
                "image/png" in output.get("data", {}) or "image/svg+xml" in output.get("data", {})
            ):
                figures += 1
            piece, n = output_html(output, f"{path.stem}: figure {figures}")
            rendered.append(piece)
            chars += n
        body = "\n".join(p for p in rendered if p)
        if not body:
            continue
        if chars > LONG_OUTPUT_CHARS:
            body = f"<details class=long><summary>Long output ({chars:,} characters): show</summary>{body}</details>"
        parts.append(f'<div class="output">{body}</div>')
    if not titled:  # a notebook without a Markdown title still gets a heading
        anchor = page.anchor(path.stem)
        page.toc.append(TocEntry(2, anchor, path.stem))
        parts.insert(0, f'<h2 id="{anchor}">{html.escape(path.stem)}</h2>')
    tables = [(p, parse_markdown_table(p.read_text())) for p in _written_tables(nb, tables_dir)]
    if tables:
        anchor = page.anchor(f"{path.stem} tables")
        page.toc.append(TocEntry(3, anchor, "Tables written"))
        items = []
        for table_path, parsed in tables:
            if parsed is None:
                inner = _pre(table_path.read_text())
            else:
                note, table = parsed
                inner = (f"<p class=note>{html.escape(note)}</p>" if note else "") + table_html(table)
            items.append(
                f"<details><summary><code>{html.escape(table_path.name)}</code> "
                f"({len(parsed[1].rows) if parsed else '?'} rows)</summary>{inner}</details>"
            )
        parts.append(
            f'<h3 id="{anchor}">Tables written</h3><p>Every Markdown table this notebook wrote '
            f"beside its figures (the CSV files of the same names hold unrounded values).</p>" + "".join(items)
        )
    return f'<section class="notebook" data-notebook="{html.escape(path.stem)}">' + "\n".join(parts) + "</section>"


# ---------------------------------------------------------------------------------------------
# Provenance and the page


def study_provenance(sources: ReportSources) -> dict[str, Any]:
    """The study's name, its runs' recorded git commits, and the report's own commit and date."""
    plan_file = sources.study_dir / "plan.json"
    name = sources.study_dir.name
    if plan_file.is_file():
        name = json.loads(plan_file.read_text()).get("name") or name
    commits: Counter = Counter()
    for config in sorted(sources.study_dir.glob("*/config.json")):
        try:
            commits[json.loads(config.read_text()).get("git_commit") or "unrecorded"] += 1
        except (OSError, json.JSONDecodeError):
            commits["unreadable config.json"] += 1
    executed = []
    for path in sources.notebooks:
        import nbformat

        end = nbformat.read(path, as_version=4).metadata.get("papermill", {}).get("end_time")
        if end:
            executed.append(end)
    return {
        "study": name,
        "study_dir": project_relative(sources.study_dir),
        "runs": sum(commits.values()),
        "run_commits": dict(commits.most_common()),
        "report_commit": git_commit() or "unknown (not a git checkout)",
        "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "notebooks_executed": max(executed) if executed else None,
        "notebooks": [project_relative(p) for p in sources.notebooks],
    }


def _provenance_html(prov: dict[str, Any]) -> str:
    def commit(sha: str) -> str:  # a git sha shortened; anything else (e.g. "unrecorded") as it is
        full = re.fullmatch(r"([0-9a-f]{40})(\+dirty)?", sha)
        return full.group(1)[:12] + (full.group(2) or "") if full else sha

    e = html.escape
    commits = ", ".join(
        f"<code>{e(commit(c))}</code> ({n} run{'s' if n != 1 else ''})" for c, n in prov["run_commits"].items()
    )
    study = (
        f"<strong>{e(prov['study'])}</strong> (<code>{e(prov['study_dir'])}</code>, {prov['runs']} run directories)"
    )
    generated = f"{e(prov['generated'])} from commit <code>{e(prov['report_commit'])}</code>"
    rows = [
        ("Study", study),
        ("Commits recorded by the runs", commits or "none recorded"),
        ("Report generated", generated),
        ("Notebooks", ", ".join(f"<code>{e(n)}</code>" for n in prov["notebooks"])),
    ]
    if prov["notebooks_executed"]:
        rows.insert(3, ("Notebooks executed", e(prov["notebooks_executed"])))
    return (
        '<table class="provenance">'
        + "".join(f"<tr><th scope=row>{k}</th><td>{v}</td></tr>" for k, v in rows)
        + "</table>"
    )


def _toc_html(toc: list[TocEntry]) -> str:
    out, open_sub = ["<ol>"], False
    for entry in toc:
        link = f'<a href="#{entry.anchor}">{html.escape(entry.text)}</a>'
        if entry.level == 2:
            if open_sub:
                out.append("</ol></li>")
                open_sub = False
            elif len(out) > 1:
                out.append("</li>")
            out.append(f"<li>{link}")
        else:
            if not open_sub:
                out.append("<ol>")
                open_sub = True
            out.append(f"<li>{link}</li>")
    out.append("</ol></li></ol>" if open_sub else ("</li></ol>" if len(out) > 1 else "</ol>"))
    return "".join(out)


_STYLE = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1b1b1b;margin:0;background:#fff}
header,main{max-width:1180px;margin:0 auto;padding:0 24px}
header{padding-top:24px}
h1{font-size:1.7em;margin:.2em 0}
h2{border-top:2px solid #ddd;padding-top:.8em;margin-top:2em}
nav#contents{background:#f6f6f6;border:1px solid #e2e2e2;padding:8px 16px;margin:16px 0}
nav#contents ol{margin:.2em 0;padding-left:1.4em}
nav#contents>ol{columns:2 360px;column-gap:32px}
nav#contents>ol>li{break-inside:avoid}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}
th,td{border:1px solid #d6d6d6;padding:3px 8px;text-align:left;vertical-align:top}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
table.sortable thead th{background:#f0f3f7;cursor:pointer;user-select:none;white-space:nowrap}
table.sortable thead th:hover{background:#e1e8f0}
table.sortable thead th::after{content:" \\2195";color:#999}
table.sortable thead th[aria-sort=ascending]::after{content:" \\25B2";color:#333}
table.sortable thead th[aria-sort=descending]::after{content:" \\25BC";color:#333}
table.sortable tbody tr:nth-child(even){background:#fafafa}
table.provenance th{background:#f6f6f6;white-space:nowrap}
.table-wrap{overflow-x:auto}
caption{text-align:left;font-weight:600;padding:2px 0}
pre.out{background:#f8f8f8;border-left:3px solid #ccc;padding:6px 10px;white-space:pre-wrap;font-size:12.5px}
pre.caption-text{background:none;border:0;padding:0;font-weight:600;margin:.8em 0 .2em}
pre.error{border-left-color:#c0392b;color:#922}
figure{margin:.8em 0}
figure img{max-width:100%;height:auto;border:1px solid #eee}
details{margin:.4em 0}
details>summary{cursor:pointer;color:#1f4e8c}
p.note{font-weight:600}
code{background:#f2f2f2;padding:0 3px;border-radius:3px}
"""

# Sorts a table's body by the clicked column: numbers (signs, thousands commas and % allowed) as
# numbers, "n/a" and blanks last, everything else as text; a second click reverses the order.
_SCRIPT = r"""
(function () {
  function key(text) {
    var t = text.trim();
    if (/^(n\/a|nan|none|-|)$/i.test(t)) return null;
    var n = t.replace(/,/g, "").replace(/%$/, "");
    return /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(n) ? parseFloat(n) : t.toLowerCase();
  }
  function sortBy(th) {
    var table = th.closest("table"), body = table.tBodies[0];
    var col = Array.prototype.indexOf.call(th.parentNode.children, th);
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    var rows = Array.prototype.slice.call(body.rows);
    var keys = rows.map(function (r) { return key(r.cells[col] ? r.cells[col].textContent : ""); });
    var numeric = keys.every(function (k) { return k === null || typeof k === "number"; });
    var order = rows.map(function (r, i) { return i; });
    order.sort(function (a, b) {
      var x = keys[a], y = keys[b];
      if (x === null || y === null) return (x === null) - (y === null) || a - b;
      var c = numeric ? x - y : String(x).localeCompare(String(y), undefined, {numeric: true});
      return (ascending ? c : -c) || a - b;
    });
    order.forEach(function (i) { body.appendChild(rows[i]); });
    Array.prototype.forEach.call(th.parentNode.children, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  }
  document.querySelectorAll("table.sortable thead th").forEach(function (th) {
    th.addEventListener("click", function () { sortBy(th); });
    th.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(th); }
    });
  });
})();
"""


def build_report(sources: ReportSources) -> str:
    """The report page for ``sources`` as one HTML string."""
    page = _Page()
    sections = [notebook_html(path, sources.tables_dir, page) for path in sources.notebooks]
    prov = study_provenance(sources)
    title = f"grpo-knobs study report: {prov['study']}"
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n'
        f"<body><header><h1>{html.escape(title)}</h1>{_provenance_html(prov)}"
        f'<nav id="contents" aria-label="Contents"><strong>Contents</strong>{_toc_html(page.toc)}</nav></header>\n'
        f"<main>{''.join(sections)}</main>\n<script>{_SCRIPT}</script></body></html>\n"
    )


def write_report(
    study_dir: str | Path, out: str | Path | None = None, notebooks_dir: str | Path | None = None
) -> Path:
    """Write the report of ``study_dir``; default path ``report.html`` beside the notebooks' tables."""
    sources = find_sources(study_dir, notebooks_dir)
    path = Path(out) if out else sources.tables_dir / REPORT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(build_report(sources), encoding="utf-8")
    tmp.replace(path)
    return path
