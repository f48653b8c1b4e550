"""PNG plots for the report (matplotlib, Agg, no display, no pyplot global state).

Each function returns PNG bytes or None when there is nothing to draw. Figures are built with the
object API (Figure + FigureCanvasAgg) so that plotting in an Ansible fork never touches a GUI
backend, and PNG metadata is stripped so the same data gives the same bytes (the report's
`changed` then means the figures really changed).
"""

from __future__ import annotations

import io

# Controller requirements (requirements.txt), guarded like the rest of the report: the plugin
# loads without them and bench_report fails naming what is missing.
try:
    import matplotlib

    matplotlib.use("Agg")  # before anything imports pyplot; harmless when already set
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
except ImportError:  # pragma: no cover - checked by the action plugin
    FigureCanvasAgg = Figure = None
try:
    import pandas as pd
except ImportError:  # pragma: no cover
    pd = None

from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import profiles_in  # noqa: E402

_PNG_METADATA = {"Software": None}


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata=_PNG_METADATA)
    return buf.getvalue()


def _colors(profiles: list) -> dict:
    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    return {p: cycle[i % len(cycle)] for i, p in enumerate(profiles)}


def _concurrency_axis(ax, levels: list) -> None:
    if levels and max(levels) / max(min(levels), 1) >= 8:
        ax.set_xscale("log")
    ax.set_xticks(levels)
    ax.set_xticklabels([str(c) for c in levels], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("concurrency (closed loop)")
    ax.grid(True, alpha=0.3)


def _hosts_grid(levels: pd.DataFrame, ncols: int, height: float):
    hosts = sorted(levels["host"].unique())
    fig = Figure(figsize=(6.4 * ncols, height * len(hosts)), layout="constrained")
    axes = fig.subplots(len(hosts), ncols, squeeze=False)
    return fig, hosts, axes


def plot_throughput(levels: pd.DataFrame, baseline: str, crossovers: list) -> bytes | None:
    if levels.empty:
        return None
    profiles = profiles_in(levels, baseline)
    colors = _colors(profiles)
    fig, hosts, axes = _hosts_grid(levels, 1, 4.2)
    for row, host in enumerate(hosts):
        ax = axes[row][0]
        host_rows = levels[levels["host"] == host]
        for profile in profiles:
            rows = host_rows[host_rows["profile"] == profile].sort_values("concurrency")
            if rows.empty:
                continue
            ok = rows[rows["usable"]]
            ax.errorbar(
                ok["concurrency"],
                ok["output_tok_s"],
                yerr=ok["output_tok_s_ci95"].fillna(0),
                marker="o",
                ms=4,
                capsize=3,
                color=colors[profile],
                label=profile,
            )
            bad = rows[~rows["usable"]]
            if not bad.empty:
                ax.scatter(
                    bad["concurrency"],
                    bad["output_tok_s"].fillna(0),
                    marker="x",
                    s=40,
                    color=colors[profile],
                    label=f"{profile}: excluded level",
                )
        for cross in crossovers:
            if cross.host == host and cross.status == "crossed":
                ax.axvline(cross.estimate, ls=":", color=colors.get(cross.profile, "grey"))
                # x in data units, y in axes units: the label sits at the bottom whatever the scale.
                ax.text(
                    cross.estimate,
                    0.03,
                    f" {cross.profile} crossover ~{cross.estimate:.1f}",
                    transform=ax.get_xaxis_transform(),
                    fontsize=8,
                    rotation=90,
                    va="bottom",
                    ha="right",
                )
        _concurrency_axis(ax, sorted(host_rows["concurrency"].unique().tolist()))
        ax.set_ylabel("output tok/s (95% CI)")
        ax.set_title(f"Output throughput vs concurrency: {host}", fontsize=10)
        ax.legend(fontsize=8)
    return _png(fig)


def plot_latency(levels: pd.DataFrame, baseline: str) -> bytes | None:
    if levels.empty:
        return None
    profiles = profiles_in(levels, baseline)
    colors = _colors(profiles)
    fig, hosts, axes = _hosts_grid(levels, 2, 3.8)
    panels = (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"))
    for row, host in enumerate(hosts):
        host_rows = levels[levels["host"] == host]
        for col, (metric, label) in enumerate(panels):
            ax = axes[row][col]
            for profile in profiles:
                rows = host_rows[host_rows["profile"] == profile].sort_values("concurrency")
                if rows.empty:
                    continue
                ax.plot(
                    rows["concurrency"],
                    rows[f"{metric}_p50_ms"],
                    marker="o",
                    ms=4,
                    color=colors[profile],
                    label=f"{profile} p50",
                )
                ax.plot(
                    rows["concurrency"],
                    rows[f"{metric}_p99_ms"],
                    ls="--",
                    marker=".",
                    color=colors[profile],
                    label=f"{profile} p99",
                )
            _concurrency_axis(ax, sorted(host_rows["concurrency"].unique().tolist()))
            ax.set_ylabel(label)
            ax.set_title(f"{label.split()[0]} vs concurrency: {host}", fontsize=10)
            ax.legend(fontsize=7)
    return _png(fig)


def plot_speedup(speedup: list, baseline: str) -> bytes | None:
    points = [p for p in speedup if p.speedup is not None]
    if not points:
        return None
    frame = pd.DataFrame([p.__dict__ for p in points])
    profiles = list(dict.fromkeys(frame["profile"]))
    colors = _colors([baseline] + profiles)
    fig, hosts, axes = _hosts_grid(frame, 1, 3.6)
    for row, host in enumerate(hosts):
        ax = axes[row][0]
        host_rows = frame[frame["host"] == host]
        for profile in profiles:
            rows = host_rows[host_rows["profile"] == profile].sort_values("concurrency")
            ok = rows[rows["usable"]]
            ax.plot(
                ok["concurrency"],
                ok["speedup"],
                marker="o",
                ms=4,
                color=colors[profile],
                label=f"{profile} / {baseline}",
            )
            bad = rows[~rows["usable"]]
            if not bad.empty:
                ax.scatter(
                    bad["concurrency"],
                    bad["speedup"],
                    marker="x",
                    s=40,
                    color=colors[profile],
                    label=f"{profile}: excluded level",
                )
        ax.axhline(1.0, color="black", lw=0.8)
        _concurrency_axis(ax, sorted(host_rows["concurrency"].unique().tolist()))
        ax.set_ylabel(f"output tok/s relative to {baseline}")
        ax.set_title(f"Speedup vs concurrency: {host}", fontsize=10)
        ax.legend(fontsize=8)
    return _png(fig)


def plot_comparison(points: list, earlier_run: str) -> bytes | None:
    rows = [p for p in points if p.delta_pct is not None]
    if not rows:
        return None
    frame = pd.DataFrame([p.__dict__ for p in rows])
    profiles = list(dict.fromkeys(frame["profile"]))
    colors = _colors(profiles)
    fig, hosts, axes = _hosts_grid(frame, 1, 3.6)
    for row, host in enumerate(hosts):
        ax = axes[row][0]
        for profile in profiles:
            sel = frame[(frame["host"] == host) & (frame["profile"] == profile)]
            sel = sel.sort_values("concurrency")
            ax.plot(
                sel["concurrency"],
                sel["delta_pct"],
                marker="o",
                ms=4,
                color=colors[profile],
                label=profile,
            )
        ax.axhline(0.0, color="black", lw=0.8)
        _concurrency_axis(ax, sorted(frame[frame["host"] == host]["concurrency"].unique().tolist()))
        ax.set_ylabel("output tok/s change (%)")
        ax.set_title(f"Against run {earlier_run}: {host}", fontsize=10)
        ax.legend(fontsize=8)
    return _png(fig)
