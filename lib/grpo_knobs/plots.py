"""The figure helpers the analysis notebooks share.

Each ``*_figure`` function takes the frames built in :mod:`grpo_knobs.analysis`
and returns a Matplotlib figure; :func:`save_figure` writes it as PNG and SVG
under a stable name with metadata stripped, so re-running a notebook on the
same records rewrites identical files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from grpo_knobs import stats

# x-axes of the learning curves: column in the curve summary -> (label, scale).
CURVE_AXES = {
    "responses": ("Cumulative training responses", 1.0),
    "active_seconds": ("Active phase minutes", 1 / 60),
    "output_tokens": ("Generated output tokens (millions)", 1e-6),
    "updates": ("Optimizer updates", 1.0),
}
GROUP_SIZES = (4, 8, 16, 32)


def axis_units(axis: str, values: np.ndarray | pd.Series) -> tuple[str, float]:
    """(label, scale) of a curve x-axis, with units that suit the data's range.

    :data:`CURVE_AXES` holds the study-sized units (minutes, millions of
    tokens); a small run (the CPU smoke study: seconds and hundreds of
    tokens) would show them as 0.00x ticks, so smaller units are used there.
    """
    label, scale = CURVE_AXES[axis]
    finite = np.asarray(values, dtype=float)
    top = float(np.nanmax(finite)) if finite.size and np.isfinite(finite).any() else 0.0
    if axis == "active_seconds" and top < 120:
        return "Active phase seconds", 1.0
    if axis == "output_tokens" and top < 1e5:
        return ("Generated output tokens (thousands)", 1e-3) if top >= 1e3 else ("Generated output tokens", 1.0)
    return label, scale


def configure() -> None:
    """Style and determinism settings (fixed SVG ids) shared by every figure."""
    mpl.rcParams.update(
        {
            "svg.hashsalt": "grpo-knobs",
            "figure.dpi": 100,
            "savefig.dpi": 100,
            "font.size": 9,
            "axes.titlesize": 10,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "legend.fontsize": 8,
        }
    )


def title_for(text: str, synthetic: bool) -> str:
    """Figure title, marked loudly when the records are synthetic fixtures."""
    return f"SYNTHETIC DATA (test fixture, not training results) - {text}" if synthetic else text


def format_pct(value: float) -> str:
    """A target such as 88.59375 shown in full, without trailing zeros."""
    return f"{value:.5f}".rstrip("0").rstrip(".")


def save_figure(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``name.png`` and ``name.svg`` under ``out_dir`` without dates or version stamps."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png, svg = out / f"{name}.png", out / f"{name}.svg"
    fig.savefig(png, metadata={"Software": None}, bbox_inches="tight")
    fig.savefig(svg, metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    return [png, svg]


def save_and_display(fig: Figure, out_dir: str | Path, name: str) -> None:
    """Save as :func:`save_figure`, close the figure and show the saved PNG in the notebook.

    Showing the file instead of re-rendering the figure keeps notebook runs
    fast and shows exactly what was written.
    """
    from IPython.display import Image, display

    png, _ = save_figure(fig, out_dir, name)
    plt.close(fig)
    display(Image(filename=str(png)))


def label_colors(labels: Sequence[str]) -> dict[str, tuple]:
    """A fixed color per recipe label, in the given order (tab10, or tab20 past ten labels)."""
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def plot_seed_curve(
    ax: plt.Axes, x: np.ndarray, mean: np.ndarray, low: np.ndarray, high: np.ndarray, color: tuple, label: str
) -> None:
    """Dots at the seed mean joined by a thin line; vertical lines over the observed seed range."""
    ax.plot(x, mean, "-", color=color, lw=0.8, alpha=0.6)
    ax.plot(x, mean, "o", color=color, ms=4, label=label)
    ax.vlines(x, low, high, color=color, lw=1.6, alpha=0.8)


def _title_and_legend_below(fig: Figure, ax: plt.Axes, title: str) -> Figure:
    """Title on top and the recipes' legend (from ``ax``) below the panels, so it hides no curve."""
    handles, names = ax.get_legend_handles_labels()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if handles:
        fig.legend(
            handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(names), 4), frameon=False
        )
    return fig


def learning_curves_figure(
    summaries: Mapping[str, pd.DataFrame], labels: Sequence[str], targets: Sequence[float], title: str
) -> Figure:
    """Validation accuracy against each x-axis of ``summaries`` (one panel each) for one task.

    ``summaries`` maps a :data:`CURVE_AXES` key to the output of
    :func:`grpo_knobs.analysis.summarize_curves` restricted to the task;
    x units follow the data (:func:`axis_units`).
    """
    colors = label_colors(labels)
    fig, axes = plt.subplots(1, len(summaries), figsize=(3.6 * len(summaries), 3.4), sharey=True, squeeze=False)
    for ax, (axis, summary) in zip(axes[0], summaries.items()):
        name, scale = axis_units(axis, summary["x"] if "x" in summary else [])
        for label in labels:
            s = summary[summary["label"] == label].sort_values("responses")
            if not s.empty:
                plot_seed_curve(
                    ax,
                    scale * s["x"].to_numpy(),
                    s["accuracy_mean_pct"].to_numpy(),
                    s["accuracy_min_pct"].to_numpy(),
                    s["accuracy_max_pct"].to_numpy(),
                    colors[label],
                    label,
                )
        for target in targets:
            ax.axhline(target, color="0.4", ls="--", lw=0.8)
        ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))  # ticks stay apart
        ax.set_xlabel(name)
    # Target labels beside the last panel, so they hide no curve.
    for target in targets:
        axes[0, -1].annotate(
            f"target {format_pct(target)}%",
            (1.02, target),
            xycoords=("axes fraction", "data"),
            fontsize=7,
            color="0.3",
            va="center",
            annotation_clip=False,
        )
    axes[0, 0].set_ylabel("Validation accuracy (%)")
    return _title_and_legend_below(fig, axes[0, 0], title)


# Panel titles of the training signals (grpo_knobs.analysis.TRAINING_SIGNALS, in its display units). The
# figures take them from here rather than from the analysis package, which imports this module's notebook setup.
SIGNAL_TITLES = {
    "reward_mean": "Training reward (%)",
    "mixed_group_fraction": "Mixed groups (%)",
    "truncation_fraction": "Truncated responses (%)",
    "response_length_mean": "Mean response length (tokens)",
}


def training_signals_figure(table: pd.DataFrame, labels: Sequence[str], title: str) -> Figure:
    """One panel per training signal against cumulative responses, seed mean and range per recipe.

    ``table`` is :func:`grpo_knobs.analysis.training_signals` for one task.
    """
    colors = label_colors(labels)
    fig, axes = plt.subplots(1, len(SIGNAL_TITLES), figsize=(3.4 * len(SIGNAL_TITLES), 3.2), squeeze=False)
    for ax, (signal, name) in zip(axes[0], SIGNAL_TITLES.items()):
        rows = table[table["signal"] == signal]
        for label in labels:
            s = rows[rows["label"] == label].sort_values("responses")
            if s.empty:
                continue
            x = s["responses"].to_numpy()
            ax.plot(x, s["mean"].to_numpy(), "-", color=colors[label], lw=1.2, label=label)
            if (s["n_seeds"] > 1).any():
                ax.fill_between(x, s["min"].to_numpy(), s["max"].to_numpy(), color=colors[label], alpha=0.15, lw=0)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("Cumulative training responses")
        ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(nbins=4))
    return _title_and_legend_below(fig, axes[0, 0], title)


def time_to_target_figure(table: pd.DataFrame, labels: Sequence[str], title: str) -> Figure:
    """Observation brackets in responses per run, one panel per target; censored runs as arrows.

    ``table`` is :func:`grpo_knobs.analysis.time_to_target_table` for one task.
    """
    targets = sorted(table["target_pct"].unique())
    colors = label_colors(labels)
    fig, axes = plt.subplots(
        1,
        len(targets),
        figsize=(5.0 * len(targets), 0.35 * len(table) / max(len(targets), 1) + 1.8),
        squeeze=False,
        sharex=True,
    )
    for ax, target in zip(axes[0], targets):
        rows = table[table["target_pct"] == target]
        rows = rows.assign(_rank=rows["recipe"].map({lab: i for i, lab in enumerate(labels)})).sort_values(
            ["_rank", "seed"], ascending=[False, False]
        )
        for y, row in enumerate(rows.itertuples()):
            color = colors.get(row.recipe, "0.5")
            if row.reached:
                ax.plot([row.responses_low, row.responses_high], [y, y], color=color, lw=5, solid_capstyle="butt")
            else:
                ax.annotate(
                    "",
                    xy=(row.censored_at * 1.06, y),
                    xytext=(row.censored_at, y),
                    arrowprops={"arrowstyle": "->", "color": color},
                )
                ax.text(
                    row.censored_at * 1.07,
                    y,
                    f"not reached by {row.censored_at:,.0f}",
                    va="center",
                    fontsize=7,
                    color=color,
                )
        ax.set_yticks(range(len(rows)), [f"{r.recipe} s{r.seed}" for r in rows.itertuples()], fontsize=7)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_title(f"target {format_pct(target)}%")
        ax.set_xlabel("Cumulative training responses")
    # Room for the longest bracket and for the "not reached" notes.
    x_max = np.nanmax([table["responses_high"].max(), 1.6 * table["censored_at"].max(), 1.0])
    axes[0, 0].set_xlim(0, 1.05 * x_max)
    fig.suptitle(title, fontsize=10)
    fig.supxlabel(
        "bar: (previous evaluation, first evaluation at or above the target];  "
        "arrow: not reached by the last evaluation",
        fontsize=8,
    )
    fig.tight_layout()
    return fig


def group_size_figure(
    points: pd.DataFrame, sizes: pd.DataFrame, title: str, group_sizes: Sequence[int] | None = None
) -> Figure:
    """Mixed-group formula over p per G with measured collections overlaid, and prompts exposed.

    ``points``: :func:`analysis.mixed_group_points` for one task;
    ``sizes``: :func:`analysis.group_size_table` for the same task (not
    empty). Formula curves are drawn for ``group_sizes``, by default the
    group sizes in ``sizes``.
    """
    if sizes.empty:
        raise ValueError("group_size_figure needs at least one group arm in sizes")
    if group_sizes is None:
        group_sizes = sorted(int(g) for g in sizes["G"].unique())
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.5, 3.6), gridspec_kw={"width_ratios": [1.6, 1]})
    p = np.linspace(0, 1, 401)
    cmap = plt.get_cmap("viridis")
    color = {g: cmap(i / max(len(group_sizes) - 1, 1)) for i, g in enumerate(group_sizes)}
    for g in group_sizes:
        ax.plot(p, stats.mixed_group_probability(p, g), color=color[g], lw=1.5, label=f"formula G={g}")
    for g, pts in points.groupby("n_samples_per_prompt"):
        ax.scatter(
            pts["reward_mean"],
            pts["mixed_group_fraction"],
            s=12,
            color=color.get(g, "0.3"),
            edgecolor="k",
            linewidth=0.3,
            label=f"measured G={g}",
            zorder=3,
        )
        predicted = pts.dropna(subset=["predicted_per_group"]) if "predicted_per_group" in pts else pts.iloc[:0]
        if len(predicted):  # the formula averaged over each group's own success rate
            ax.scatter(
                predicted["reward_mean"],
                predicted["predicted_per_group"],
                s=14,
                facecolor="none",
                edgecolor=color.get(g, "0.3"),
                marker="D",
                linewidth=0.7,
                zorder=3,
                label=f"per-group prediction G={g}",
            )
    ax.set_xlabel("p: success probability (measured: collection mean training reward)")
    ax.set_ylabel("Mixed-group probability / fraction")
    ax.legend(ncol=2, fontsize=7)
    ax.set_ylim(0, 1.02)
    ordered = sizes.sort_values("G")
    bars = bx.bar(
        [str(g) for g in ordered["G"]], ordered["prompts_exposed"], color=[color.get(g, "0.5") for g in ordered["G"]]
    )
    bx.bar_label(bars, labels=[f"{v:,}" for v in ordered["prompts_exposed"]], fontsize=7)
    bx.set_xlabel("Group size G")
    bx.set_ylabel(f"Prompts exposed in {int(ordered['responses'].max()):,} responses")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def reward_audit_figure(audit: pd.DataFrame, initial: pd.DataFrame, title: str) -> Figure:
    """Strict vs flexible accuracy of the initial model: audited outputs and terminal test."""
    sources = [("audited outputs", audit), ("initial terminal test", initial)]
    sources = [(name, frame) for name, frame in sources if not frame.empty]
    if not sources:
        raise ValueError("reward_audit_figure needs audit rows or initial-model test rows")
    fig, axes = plt.subplots(1, len(sources), figsize=(4.2 * len(sources), 3.2), squeeze=False)
    for ax, (name, frame) in zip(axes[0], sources):
        x = np.arange(len(frame))
        for offset, col, lab in ((-0.2, "strict_pct", "strict"), (0.2, "flexible_pct", "flexible")):
            bars = ax.bar(x + offset, frame[col], width=0.4, label=lab)
            ax.bar_label(bars, fmt="%.1f", fontsize=7)
        ax.set_xticks(x, frame["task"])
        if not (frame[["strict_pct", "flexible_pct"]].to_numpy() > 0).any():
            ax.set_ylim(0, 100)
        ax.set_ylabel("Accuracy (%)")
        ax.set_title(name)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def screening_figure(tables: Mapping[str, pd.DataFrame], title: str) -> Figure:
    """Per screening question: final validation % and job time relative to the question's first arm.

    Bars are ours; hollow markers are the study's published numbers when
    ``study_*`` columns are present. Job time is shown relative to the first
    arm because the study's hardware and budget differ from ours.
    """
    fig, axes = plt.subplots(len(tables), 2, figsize=(9.5, 2.6 * len(tables)), squeeze=False)
    for row, (question, t) in zip(axes, tables.items()):
        x = np.arange(len(t))
        has_study = "study_val_pct" in t.columns and t["study_val_pct"].notna().any()
        row[0].bar(x, t["val_pct"], color="tab:blue", label="ours")
        row[1].bar(x, t["job_min"] / t["job_min"].iloc[0], color="tab:orange", label="ours")
        if has_study:
            row[0].plot(x, t["study_val_pct"], "o", mfc="none", mec="k", label="study (published)")
            row[1].plot(
                x, t["study_job_min"] / t["study_job_min"].iloc[0], "o", mfc="none", mec="k", label="study (published)"
            )
        ticks = (
            [f"{r.arm}\n{r.P}/{r.G}/{r.B}/{r.S}" for r in t.itertuples()]
            if {"P", "G", "B", "S"} <= set(t)
            else t["arm"]
        )
        for ax in row:
            ax.set_xticks(x, ticks, fontsize=7)
        top = np.nanmax([t["val_pct"].max(), t["study_val_pct"].max() if has_study else 0.0])
        top = 1.15 * top if top > 0 else 100.0
        row[0].set_ylim(0, top)
        # Values inside tall bars (clear of the study's circles at their tops), above short ones,
        # so a 0% bar still reads as a measured zero rather than missing data.
        for xi, value in zip(x, t["val_pct"]):
            inside = value >= 0.3 * top
            row[0].text(
                xi,
                value / 2 if inside else value + 0.02 * top,
                f"{value:.1f}",
                ha="center",
                va="center" if inside else "bottom",
                fontsize=7,
                color="white" if inside else "black",
            )
        row[0].set_ylabel("Final val. accuracy (%)")
        row[1].set_ylabel(f"Job time / {t['arm'].iloc[0]}")
        row[0].set_title(question, loc="left", fontsize=9)
        if has_study:
            row[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def critical_batch_figure(
    bench: pd.DataFrame | None,
    measured: pd.DataFrame,
    critical_gen: float | None,
    rt: pd.DataFrame | None,
    critical_train: float | None,
    tolerance: float,
    prediction: pd.DataFrame | None,
    title: str,
    throughput_column: str | None = None,
) -> Figure:
    """Throughput over batch, responses-to-target over B, predicted vs measured time-to-target.

    Each panel is drawn only when it has data: the throughput panel needs the
    rollout benchmark (``bench``), the responses-to-target panel rows in
    ``rt`` and the prediction panel rows in ``prediction`` (and ``bench``).
    ``measured``: :func:`analysis.measured_generation_throughput`; ``rt``:
    :func:`analysis.responses_to_target` rows of the training-batch arms;
    ``throughput_column``: the benchmark column ``critical_gen`` was read from.
    """
    has_rt = rt is not None and not rt.empty
    has_prediction = prediction is not None and not prediction.empty and bench is not None
    n_panels = int(bench is not None) + int(has_rt) + int(has_prediction)
    if n_panels == 0:
        raise ValueError("critical_batch_figure needs a benchmark, responses-to-target rows or a prediction")
    fig, axes = plt.subplots(1, n_panels, figsize=(4.4 * n_panels, 3.6), squeeze=False)
    axes = list(axes[0])
    if bench is not None:
        ax = axes.pop(0)
        for col, style in (
            ("eager_tokens_per_s", "s--"),
            ("fast_tokens_per_s", "o-"),
            ("fused_tokens_per_s", "^-"),
            ("bandwidth_bound_tokens_per_s", ":"),
        ):
            if col not in bench or bench[col].isna().all():  # fused: benchmarks from before the fused path
                continue
            ax.plot(bench["batch"], bench[col], style, ms=3, label=f"benchmark {col.removesuffix('_tokens_per_s')}")
        if not measured.empty:
            ax.plot(measured["generation_batch"], measured["tokens_per_s"], "kx", label="runs: measured generation")
        if critical_gen is not None:
            which = f" ({throughput_column.removesuffix('_tokens_per_s')})" if throughput_column else ""
            ax.axvline(
                critical_gen,
                color="tab:red",
                ls="--",
                lw=1,
                label=f"critical generation batch {critical_gen:g}{which}",
            )
        # Log axes: eager, fast and bandwidth-bound throughput differ by orders of magnitude.
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(mpl.ticker.ScalarFormatter())
        ax.set_yscale("log")
        ax.set_xlabel("Concurrent generation batch (responses)")
        ax.set_ylabel("Output tokens / s (log scale)")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    if has_rt:
        _responses_to_target_panel(axes.pop(0), rt, critical_train, tolerance)
    if has_prediction:
        ax = axes.pop(0)
        steps = "predicted_steps_active_s" in prediction
        hi = 1.1 * max(
            prediction["measured_active_s"].max(),
            prediction["predicted_active_s"].max(),
            prediction["predicted_steps_active_s"].max() if steps else 0.0,
            1.0,
        )
        ax.plot([0, hi], [0, hi], color="0.5", lw=0.8, ls="--", label="predicted = measured")
        # One color and marker per arm with a legend: arms often land close together, where text labels collide.
        # Filled: decode-steps model (longest response per chunk); hollow: mean-length throughput model.
        cmap, markers = plt.get_cmap("tab10"), "osD^v<>p"
        for i, row in enumerate(prediction.itertuples()):
            marker, color = markers[(i // 10) % len(markers)], cmap(i % 10)
            predicted = row.predicted_steps_active_s if steps else row.predicted_active_s
            if steps:
                ax.plot(
                    row.measured_active_s, row.predicted_active_s, marker, mfc="none", color=color, ms=5, alpha=0.85
                )
                ax.plot(
                    [row.measured_active_s] * 2, [row.predicted_active_s, predicted], color=color, lw=0.6, alpha=0.6
                )
            ax.plot(row.measured_active_s, predicted, marker, color=color, ms=5, alpha=0.85, label=row.arm)
        if steps:
            ax.text(
                0.98,
                0.02,
                "hollow: N x mean length / throughput\nfilled: decode steps to the longest response",
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                fontsize=6,
            )
        ax.set_xlim(0, hi)
        ax.set_ylim(0, hi)
        ax.set_xlabel("Measured active seconds to target")
        ax.set_ylabel("Predicted active seconds to target")
        ax.legend(fontsize=6, loc="upper left", ncol=2 if len(prediction) > 6 else 1)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _responses_to_target_panel(ax: plt.Axes, rt: pd.DataFrame, critical_train: float | None, tolerance: float) -> None:
    """Responses to target over the optimizer batch B; censored arms as "not reached by N"."""
    reached = rt[rt["reached"]]
    ax.plot(reached["global_batch_size"], reached["responses_needed"], "o", color="tab:blue", label="reached")
    for row in reached.itertuples():
        ax.annotate(
            row.arm,
            (row.global_batch_size, row.responses_needed),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, -10),
        )
    for row in rt[~rt["reached"]].itertuples():
        ax.plot(row.global_batch_size, row.censored_at, "^", color="tab:gray")
        ax.annotate(
            f"not reached by {row.censored_at:,.0f}",
            (row.global_batch_size, row.censored_at),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, 4),
        )
    if not reached.empty:
        ax.axhspan(
            reached["responses_needed"].min(),
            tolerance * reached["responses_needed"].min(),
            color="tab:green",
            alpha=0.15,
            label=f"within {tolerance:g}x of the fewest",
        )
    if critical_train is not None:
        ax.axvline(critical_train, color="tab:red", ls="--", lw=1, label=f"critical training batch {critical_train:g}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(mpl.ticker.ScalarFormatter())
    ax.set_xticks(sorted(rt["global_batch_size"].unique()))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("Optimizer batch B (responses per update)")
    ax.set_ylabel("Responses to target\n(first evaluation at or above it)")
    ax.legend(fontsize=7)


def collapse_figure(
    series: pd.DataFrame, points: pd.DataFrame, labels: Sequence[str], threshold: float, title: str
) -> Figure:
    """Zero-advantage share per collection of every run (one thin line each, colored by recipe), the
    collapse threshold dashed and the start of every collapse stretch marked with an x; beside it the
    mean token entropy where recorded.

    ``series``: :func:`analysis.zero_advantage_series` for one task and phase;
    ``points``: :func:`analysis.collapse_points` of the same runs.
    """
    colors = label_colors(labels)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.4))
    for (label, _), run in series.groupby(["label", "run_id"], sort=False):
        ax.plot(
            run["responses"],
            100 * run["zero_advantage_fraction"],
            "-",
            lw=0.9,
            alpha=0.75,
            color=colors.get(label, "0.5"),
        )
        if run["entropy_mean"].notna().any():
            bx.plot(run["responses"], run["entropy_mean"], "-", lw=0.9, alpha=0.75, color=colors.get(label, "0.5"))
    for label in labels:  # one legend entry per recipe
        ax.plot([], [], "-", color=colors[label], label=label)
    starts = points.loc[points["collapsed"], ["run_id", "stretch_collections"]].explode("stretch_collections")
    starts = starts.astype({"stretch_collections": int}).rename(columns={"stretch_collections": "collection"})
    hit = starts.merge(series, on=["run_id", "collection"])
    ax.scatter(
        hit["responses"], 100 * hit["zero_advantage_fraction"], marker="x", s=40, color="k", zorder=4, label="collapse"
    )
    ax.axhline(100 * threshold, color="0.4", ls="--", lw=0.8)
    sources = sorted(series["source"].unique())
    ax.set_ylabel("Groups with all-zero advantage (%)")
    ax.set_title("zero-advantage share (" + "; ".join(sources) + ")", fontsize=8)
    ax.set_ylim(0, 102)
    if not series["entropy_mean"].notna().any():
        bx.text(0.5, 0.5, "entropy not recorded for these runs", ha="center", va="center", transform=bx.transAxes)
    bx.set_ylabel("Mean token entropy (nats)")
    bx.set_title("entropy of the sampled responses", fontsize=8)
    for a in (ax, bx):
        a.set_xlabel("Cumulative training responses")
        a.xaxis.set_major_locator(mpl.ticker.MaxNLocator(nbins=5))
    return _title_and_legend_below(fig, ax, title)


def category_curves_figure(
    table: pd.DataFrame, labels: Sequence[str], categories: Sequence[str], title: str
) -> Figure:
    """Validation accuracy per category over training, one panel per category, seed mean and range.

    ``table``: :func:`analysis.category_curves` for one task.
    """
    colors = label_colors(labels)
    n = len(categories)
    fig, axes = plt.subplots(1, n, figsize=(2.6 * n, 3.0), sharey=True, squeeze=False)
    for ax, cat in zip(axes[0], categories):
        rows = table[table["category"] == cat]
        for label in labels:
            s = rows[rows["label"] == label].sort_values("responses")
            if not s.empty:
                plot_seed_curve(
                    ax,
                    s["responses"].to_numpy(),
                    s["accuracy_pct"].to_numpy(),
                    s["min_pct"].to_numpy(),
                    s["max_pct"].to_numpy(),
                    colors[label],
                    label,
                )
        size = int(rows["problems"].iloc[0]) if len(rows) else 0
        ax.set_title(f"{cat} ({size} problems)", fontsize=9)
        ax.set_xlabel("Responses")
        ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(nbins=3))
    axes[0, 0].set_ylabel("Validation accuracy (%)")
    axes[0, 0].set_ylim(-3, 103)
    return _title_and_legend_below(fig, axes[0, 0], title)


def preregistered_figure(scores: pd.DataFrame, table: pd.DataFrame, title: str) -> Figure:
    """Left, one panel per task: each compared recipe's test accuracy per seed (dots) and its seed mean
    (bar). Right: every registered comparison x - y with its seed-level interval (thin, wide) and the
    conditional one (thick), Holm's adjusted p beside it; a comparison short of its registered seeds
    is marked a preview.

    ``scores``: rows of (task, arm, seed, test_pct) (``analysis.seed_test_scores``); ``table``:
    ``analysis.preregistered_comparisons``.
    """
    tasks = list(dict.fromkeys(scores["task"]))
    widths = [scores.loc[scores["task"] == t, "arm"].nunique() for t in tasks]
    fig, axes = plt.subplots(
        1, len(tasks) + 1, figsize=(1.3 * sum(widths) + 6.0, 3.6), width_ratios=[*widths, 4.0], squeeze=False
    )
    colors = label_colors(list(dict.fromkeys(scores["arm"])))  # one color per recipe in every panel
    jitter = np.random.default_rng(0)  # fixed: the figure is the same on every run
    for ax, task in zip(axes[0], tasks):
        t = scores[scores["task"] == task]
        arms = list(dict.fromkeys(t["arm"]))
        for i, arm in enumerate(arms):
            v = t.loc[t["arm"] == arm, "test_pct"].to_numpy()  # [seeds]
            ax.plot(i + jitter.uniform(-0.15, 0.15, len(v)), v, "o", ms=3.5, alpha=0.7, color=colors[arm])
            ax.hlines(v.mean(), i - 0.32, i + 0.32, color="k", lw=1.6)
        ax.set_xticks(range(len(arms)), [f"{a}\nn = {(t['arm'] == a).sum()}" for a in arms], fontsize=7)
        ax.set_xlim(-0.6, len(arms) - 0.4)
        ax.set_ylabel("Test accuracy (%), one dot per seed")
        ax.set_title(task, loc="left", fontsize=9)
    ax = axes[0][-1]
    y = np.arange(len(table))[::-1]
    for yi, r in zip(y, table.itertuples(index=False)):
        if np.isnan(r.perm_p):
            continue
        ax.hlines(yi, r.seed_low_pp, r.seed_high_pp, color="tab:blue", lw=1.2, label="seed-level 95%")
        ax.hlines(yi, r.cond_low_pp, r.cond_high_pp, color="tab:orange", lw=4.5, alpha=0.8, label="conditional 95%")
        ax.plot(r.mean_pp, yi, "o", color="k", ms=4)
        preview = "" if r.complete else f"\npreview, {min(r.n_seeds_x, r.n_seeds_y)} of {r.registered_seeds} seeds"
        ax.annotate(
            f"Holm p {r.holm_p:.2f}{preview}",
            (1.0, yi),
            xycoords=("axes fraction", "data"),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    ax.axvline(0, color="grey", lw=0.8, ls="--")
    ax.set_yticks(y, [f"{r.task}:\n{r.x} - {r.y}" for r in table.itertuples()], fontsize=7)
    ax.set_ylim(-0.6, len(table) - 0.4)
    ax.set_xlabel("Difference x - y in test accuracy (pp)")
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
