"""Writing tables: display strings, Markdown pipe tables, CSV and Markdown files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

# Columns whose values fixed decimals would round away: a learning rate keeps three significant digits.
COLUMN_FORMATS = {"lr": ".3g"}


def format_frame(table: pd.DataFrame, decimals: int = 2, formats: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Cells as display strings: floats to ``decimals`` places unless ``formats`` (or
    :data:`COLUMN_FORMATS`) gives a column its own format spec (e.g. ``{"lr": ".1e"}``); NaN
    shows as "n/a"."""
    formats = {**COLUMN_FORMATS, **(formats or {})}

    def column(col: pd.Series) -> pd.Series:
        spec = formats.get(col.name, f".{decimals}f")

        def cell(v: object) -> str:
            if isinstance(v, (float, np.floating)):
                return "n/a" if math.isnan(v) else format(v, spec)
            if isinstance(v, (tuple, list)):  # e.g. per-seed differences
                return ", ".join(cell(x) for x in v)
            return str(v)

        return col.map(cell)

    return table.apply(column).astype(str)


def to_markdown(table: pd.DataFrame) -> str:
    """A GitHub pipe table of ``table`` as displayed (cells converted with ``str``)."""
    header = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in table.columns) + " |"
    body = ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def write_table(
    table: pd.DataFrame,
    out_dir: str | Path,
    name: str,
    decimals: int = 2,
    formats: Mapping[str, str] | None = None,
    note: str | None = None,
) -> list[Path]:
    """Write ``name.csv`` (values, floats rounded to 6 places) and ``name.md`` (as :func:`format_frame`).

    ``note`` (e.g. :attr:`Study.note`) opens the Markdown file in bold, so a
    table read on its own still says where its numbers come from. The
    ``result`` objects of :func:`time_to_target_table` are not written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / f"{name}.csv", out / f"{name}.md"
    values = table.drop(columns=["result"], errors="ignore")
    # Sequence cells (per-seed values) as "a; b; c", rounded like the other floats.
    csv_values = values.round(6).apply(
        lambda col: col.map(
            lambda v: "; ".join(str(round(float(x), 6)) for x in v) if isinstance(v, (tuple, list)) else v
        )
    )
    csv_values.to_csv(csv_path, index=False)
    header = f"**{note}**\n\n" if note else ""
    md_path.write_text(header + to_markdown(format_frame(values, decimals, formats)))
    return [csv_path, md_path]
