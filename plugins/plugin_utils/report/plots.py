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

from ansible_collections.servelab.serving.plugins.module_utils.results.levels import FIELD  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import (  # noqa: E402
    exclusion_reason,
    profiles_in,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.figures import pareto_points, speedup_bands  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.report.intervals import clipped_yerr  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.report.distributions import (  # noqa: E402
    ITL_CHUNK,
    ITL_TOKEN,
    ITL_TPOT,
)

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


def _badge(fig: Figure, badge: str | None) -> None:
    """The time-scale badge (figures.time_scale_badge) across the top of a scaled run's figure."""
    if badge:
        # One line where the figure is wide enough (about 0.075 in a character at 9 pt), else the
        # real-time equivalent goes on a second line under the factor.
        if len(badge) * 0.075 > fig.get_figwidth():
            badge = badge.replace(" | ", "\n", 1)
        fig.suptitle(badge, fontsize=9, color="#8a3b00",
                     bbox={"boxstyle": "round,pad=0.3", "fc": "#fff3e0", "ec": "#e08a00"})


def _excluded(ax, x, y, color, label: str) -> None:
    """Excluded levels (the frame's `usable` false): an x, named in the legend with the reason."""
    ax.scatter(x, y, marker="x", s=40, color=color, label=label, zorder=3)


def _by_reason(rows: pd.DataFrame):
    """(reason, rows) of the excluded rows, one group per reason for its legend entry."""
    bad = rows[~rows["usable"]]
    if bad.empty:
        return []
    reasons = bad.apply(exclusion_reason, axis=1)
    return [(reason, bad[reasons == reason]) for reason in dict.fromkeys(reasons)]


def _unit(name: str) -> str:
    return FIELD[name].unit


def _header(name: str) -> str:
    return FIELD[name].header


def plot_throughput(levels: pd.DataFrame, baseline: str, crossovers: list,
                    badge: str | None = None) -> bytes | None:
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
                # the lower arm stops at 0 tok/s (intervals.py)
                yerr=clipped_yerr(ok["output_tok_s"], ok["output_tok_s_ci95"]),
                marker="o",
                ms=4,
                capsize=3,
                color=colors[profile],
                label=profile,
            )
            for reason, bad in _by_reason(rows):
                _excluded(ax, bad["concurrency"], bad["output_tok_s"].fillna(0),
                          colors[profile], f"{profile}: excluded ({reason})")
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
    _badge(fig, badge)
    return _png(fig)


def plot_latency(levels: pd.DataFrame, baseline: str, badge: str | None = None) -> bytes | None:
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
                ok = rows[rows["usable"]]
                ax.plot(
                    ok["concurrency"],
                    ok[f"{metric}_p50_ms"],
                    marker="o",
                    ms=4,
                    color=colors[profile],
                    label=f"{profile} p50",
                )
                ax.plot(
                    ok["concurrency"],
                    ok[f"{metric}_p99_ms"],
                    ls="--",
                    marker=".",
                    color=colors[profile],
                    label=f"{profile} p99",
                )
                for reason, bad in _by_reason(rows):
                    _excluded(ax, bad["concurrency"], bad[f"{metric}_p50_ms"], colors[profile],
                              f"{profile}: excluded ({reason}), p50")
            _concurrency_axis(ax, sorted(host_rows["concurrency"].unique().tolist()))
            ax.set_ylabel(label)
            ax.set_title(f"{label.split()[0]} vs concurrency: {host}", fontsize=10)
            ax.legend(fontsize=7)
    _badge(fig, badge)
    return _png(fig)


def plot_rate(rate_levels: pd.DataFrame | None, baseline: str,
              badge: str | None = None) -> bytes | None:
    """Open-loop levels: output tok/s and TTFT p50/p99 against the offered request rate, one
    curve per profile and host panel (the rate sweep's own plot; not part of the comparison)."""
    if rate_levels is None or rate_levels.empty:
        return None
    profiles = profiles_in(rate_levels, baseline)
    colors = _colors(profiles)
    fig, hosts, axes = _hosts_grid(rate_levels, 2, 3.8)
    for row, host in enumerate(hosts):
        host_rows = rate_levels[rate_levels["host"] == host]
        tok_ax, ttft_ax = axes[row][0], axes[row][1]
        for profile in profiles:
            rows = host_rows[host_rows["profile"] == profile].sort_values("request_rate")
            if rows.empty:
                continue
            ok = rows[rows["usable"]]
            tok_ax.errorbar(ok["request_rate"], ok["output_tok_s"],
                            yerr=clipped_yerr(ok["output_tok_s"], ok["output_tok_s_ci95"]),
                            marker="o", ms=4, capsize=3, color=colors[profile], label=profile)
            ttft_ax.plot(ok["request_rate"], ok["ttft_p50_ms"], marker="o", ms=4,
                         color=colors[profile], label=f"{profile} p50")
            ttft_ax.plot(ok["request_rate"], ok["ttft_p99_ms"], ls="--", marker=".",
                         color=colors[profile], label=f"{profile} p99")
            for reason, bad in _by_reason(rows):
                _excluded(tok_ax, bad["request_rate"], bad["output_tok_s"].fillna(0),
                          colors[profile], f"{profile}: excluded ({reason})")
        for ax in (tok_ax, ttft_ax):
            ax.set_xlabel(f"{_header('request_rate')} request rate ({_unit('request_rate')}, "
                          "open loop)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        tok_ax.set_ylabel(f"{_header('output_tok_s')} ({_unit('output_tok_s')})")
        ttft_ax.set_ylabel(f"TTFT ({_unit('ttft_p50_ms')})")
        tok_ax.set_title(f"Output throughput vs offered rate: {host}", fontsize=10)
        ttft_ax.set_title(f"TTFT vs offered rate: {host}", fontsize=10)
    _badge(fig, badge)
    return _png(fig)


def _speedup_reason(point, reasons: dict) -> str:
    """Why a speedup point is excluded: its level's or the baseline's reason, named."""
    words = [f"{who} {reasons[(point.host, who, point.concurrency)]}"
             for who in (point.profile, point.baseline)
             if reasons.get((point.host, who, point.concurrency))]
    return "; ".join(words) or "excluded"


def plot_speedup(speedup: list, baseline: str, levels: pd.DataFrame | None = None,
                 crossovers: list = (), badge: str | None = None) -> bytes | None:
    """Speedup per level; with `levels`, the 95% CI band of the ratio (figures.speedup_bands:
    both levels' CI95 propagated to first order) and the excluded levels' reasons; every crossed
    crossover marked: its bracket shaded, its linear estimate a dotted line."""
    points = [p for p in speedup if p.speedup is not None]
    if not points:
        return None
    frame = pd.DataFrame([p.__dict__ for p in points])
    profiles = list(dict.fromkeys(frame["profile"]))
    colors = _colors([baseline] + profiles)
    reasons, bands = {}, {}
    if levels is not None and not levels.empty:
        reasons = {(str(r["host"]), str(r["profile"]), int(r["concurrency"])): exclusion_reason(r)
                   for _key, r in levels.iterrows()}
        for host, profile, c, low, high in speedup_bands(speedup, levels):
            bands.setdefault((host, profile), []).append((c, low, high))
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
            band = sorted(bands.get((host, profile), []))
            if band:
                ax.fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band],
                                color=colors[profile], alpha=0.18, lw=0,
                                label=f"{profile}: 95% CI of the ratio")
            bad = [p for p in points if p.host == host and p.profile == profile and not p.usable]
            by_reason: dict = {}
            for p in bad:
                by_reason.setdefault(_speedup_reason(p, reasons), []).append(p)
            for reason, group in by_reason.items():
                _excluded(ax, [p.concurrency for p in group], [p.speedup for p in group],
                          colors[profile], f"{profile}: excluded ({reason})")
        for cross in crossovers:
            if cross.host != host or cross.status != "crossed" or cross.profile not in profiles:
                continue
            color = colors.get(cross.profile, "grey")
            ax.axvspan(cross.bracket[0], cross.bracket[1], color=color, alpha=0.07, lw=0)
            ax.axvline(cross.estimate, ls=":", color=color,
                       label=f"{cross.profile} crossover: C={cross.bracket[0]}-"
                             f"{cross.bracket[1]}, est. ~{cross.estimate:.1f}")
        ax.axhline(1.0, color="black", lw=0.8)
        _concurrency_axis(ax, sorted(host_rows["concurrency"].unique().tolist()))
        ax.set_ylabel(f"{_header('output_tok_s')} {_unit('output_tok_s')} relative to {baseline}")
        ax.set_title(f"Speedup vs concurrency: {host}", fontsize=10)
        ax.legend(fontsize=8)
    _badge(fig, badge)
    return _png(fig)


def plot_comparison(points: list, earlier_run: str, levels: pd.DataFrame | None = None,
                    badge: str | None = None) -> bytes | None:
    rows = [p for p in points if p.delta_pct is not None]
    if not rows:
        return None
    frame = pd.DataFrame([p.__dict__ for p in rows])
    reasons = {}
    if levels is not None:
        reasons = {(str(r["host"]), str(r["profile"]), int(r["concurrency"])): exclusion_reason(r)
                   for _key, r in levels.iterrows()}
    frame["reason"] = [reasons.get((str(h), str(p), int(c)), "") for h, p, c in
                       zip(frame["host"], frame["profile"], frame["concurrency"], strict=True)]
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
            for reason in dict.fromkeys(r for r in sel["reason"] if r):
                bad = sel[sel["reason"] == reason]
                _excluded(ax, bad["concurrency"], bad["delta_pct"], colors[profile],
                          f"{profile}: excluded in this run ({reason})")
        ax.axhline(0.0, color="black", lw=0.8)
        _concurrency_axis(ax, sorted(frame[frame["host"] == host]["concurrency"].unique().tolist()))
        ax.set_ylabel("output tok/s change (%)")
        ax.set_title(f"Against run {earlier_run}: {host}", fontsize=10)
        ax.legend(fontsize=8)
    _badge(fig, badge)
    return _png(fig)


def pareto_labels(points: list) -> tuple[str, str]:
    """(x label, y label) of the Pareto plot, from the field table's output tok/s."""
    tok_s = f"{_header('output_tok_s')} {_unit('output_tok_s')}"
    x = f"{_unit('output_tok_s')} per user = {tok_s} \u00f7 C (closed loop: C users)"
    known = {p.gpus is not None for p in points}
    if known == {True}:
        y = f"{tok_s} per GPU"
    elif known == {False}:
        y = f"{tok_s} per host (GPU count not in manifest.json)"
    else:
        y = f"{tok_s} per GPU, per host where the GPU count is unknown (see legend)"
    return x, y


def plot_pareto(levels: pd.DataFrame, baseline: str, gpus: dict,
                badge: str | None = None) -> bytes | None:
    """Output tok/s per GPU against tok/s per user, one curve per (profile, host), each point
    labelled with its C; the Pareto frontier (figures.pareto_points) over the usable levels."""
    points = pareto_points(levels, gpus)
    if not points:
        return None
    profiles = profiles_in(levels, baseline)
    colors = _colors(profiles)
    hosts = sorted({p.host for p in points})
    markers = ["o", "s", "^", "D", "v", "P"]
    fig = Figure(figsize=(8.0, 5.6), layout="constrained")
    ax = fig.subplots()
    for h, host in enumerate(hosts):
        for profile in profiles:
            curve = sorted((p for p in points if p.host == host and p.profile == profile),
                           key=lambda p: p.concurrency)
            if not curve:
                continue
            name = profile if len(hosts) == 1 else f"{profile} on {host}"
            n = curve[0].gpus
            name += f" (\u00f7 {n} GPUs)" if n else " (per host: GPU count unknown)"
            ok = [p for p in curve if p.usable]
            ax.plot([p.per_user for p in ok], [p.per_unit for p in ok],
                    marker=markers[h % len(markers)], ms=5, color=colors[profile], label=name)
            reasons: dict = {}
            for p in curve:
                if not p.usable:
                    reasons.setdefault(p.reason, []).append(p)
            for reason, group in reasons.items():
                _excluded(ax, [p.per_user for p in group], [p.per_unit for p in group],
                          colors[profile], f"{name}: excluded ({reason})")
            for p in curve:
                ax.annotate(f"C={p.concurrency}", (p.per_user, p.per_unit), fontsize=7,
                            xytext=(4, 4), textcoords="offset points", color=colors[profile])
    groups: dict = {}
    for p in points:
        if p.frontier:
            groups.setdefault(None if all(q.gpus for q in points) else p.host, []).append(p)
    labelled = False
    for members in groups.values():
        members.sort(key=lambda p: p.per_user)
        ax.plot([p.per_user for p in members], [p.per_unit for p in members], color="black",
                lw=2.5, alpha=0.25, zorder=1, label=None if labelled else "Pareto frontier")
        ax.scatter([p.per_user for p in members], [p.per_unit for p in members], s=90,
                   facecolors="none", edgecolors="black", lw=1, zorder=4,
                   label=None if labelled else "on the frontier (usable levels)")
        labelled = True
    x_label, y_label = pareto_labels(points)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(True, alpha=0.3)
    ax.set_title("Throughput per GPU against throughput per user (up and right is better)",
                 fontsize=10)
    ax.legend(fontsize=7)
    _badge(fig, badge)
    return _png(fig)


ITL_LABELS = {
    ITL_TOKEN: "ITL per token, from chunk arrival times",
    ITL_CHUNK: "ITL per chunk, from chunk arrival times (tokens per chunk unknown)",
}


def cdf_axis_label(metric: str, bases: set) -> str:
    """The x label of a CDF plot; the ITL basis is named (token, chunk, or the TPOT proxy)."""
    if metric == "ttft":
        return f"{_header('ttft_p50_ms').split()[0]} per window request ({_unit('ttft_p50_ms')})"
    unit = _unit("tpot_p50_ms")
    if len(bases) == 1:
        basis = next(iter(bases))
        if basis in ITL_LABELS:
            return f"{ITL_LABELS[basis]} ({unit})"
        return (f"{_header('tpot_p50_ms').split()[0]} per window request ({unit}): inter-token "
                "proxy, the records hold no per-chunk times")
    return f"ITL ({unit}): basis per curve in the legend (chunk times or the TPOT proxy)"


def plot_cdf(series: list, metric: str, chosen: dict, baseline: str,
             badge: str | None = None) -> bytes | None:
    """Empirical CDFs per profile, one panel per (host, chosen level); an excluded level's
    curve is dotted and its legend entry says why; a chosen level not measured says so."""
    series = [s for s in series if s.metric == metric]
    if not series:
        return None
    hosts = sorted(chosen)
    ncols = max(len(chosen[h]) for h in hosts)
    profiles = list(dict.fromkeys(
        ([baseline] if any(s.profile == baseline for s in series) else [])
        + [s.profile for s in series]))
    colors = _colors(profiles)
    bases = {s.itl_basis for s in series}
    fig = Figure(figsize=(4.2 * ncols, 3.4 * len(hosts)), layout="constrained")
    axes = fig.subplots(len(hosts), ncols, squeeze=False)
    name = "TTFT" if metric == "ttft" else "ITL"
    for row, host in enumerate(hosts):
        for col in range(ncols):
            ax = axes[row][col]
            if col >= len(chosen[host]):
                ax.set_axis_off()
                continue
            c = chosen[host][col]
            drawn = [s for s in series if s.host == host and s.concurrency == c]
            ax.set_title(f"{name} CDF at C={c}: {host}", fontsize=9)
            if not drawn:
                ax.text(0.5, 0.5, f"C={c}: no window request measured", ha="center",
                        va="center", transform=ax.transAxes, fontsize=8)
                continue
            for s in sorted(drawn, key=lambda s: profiles.index(s.profile)):
                label = f"{s.profile} (n={s.samples})"
                if len(bases) > 1:
                    label += f", {s.itl_basis}"
                if not s.usable:
                    label += f": excluded ({s.reason})"
                # From 0 below the smallest sample, so a level whose samples are all equal
                # still shows its jump.
                ax.step([s.x[0]] + s.x, [0.0] + s.y, where="post", color=colors[s.profile],
                        ls="-" if s.usable else ":", lw=1.4 if s.usable else 1.2, label=label)
            ax.set_ylim(0, 1.02)
            ax.set_ylabel("fraction of requests" if metric == "ttft" or bases == {ITL_TPOT}
                          else "fraction of inter-token gaps", fontsize=8)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
    fig.supxlabel(cdf_axis_label(metric, bases), fontsize=9)
    _badge(fig, badge)
    return _png(fig)


GPU_PANELS = ("gpu_sm_util_mean", "gpu_power_w_mean", "tokens_per_joule")


def plot_gpu(levels: pd.DataFrame, baseline: str, badge: str | None = None) -> bytes | None:
    """GPU telemetry (report/telemetry.py) against concurrency, a curve per profile: SM
    utilisation, summed power, and tokens per joule where power was known. None without any
    telemetry (the report then says why in a note)."""
    if levels.empty or not all(name in levels.columns for name in GPU_PANELS):
        return None
    measured = levels[pd.to_numeric(levels["gpu_sm_util_mean"], errors="coerce").notna()
                      | pd.to_numeric(levels["gpu_power_w_mean"], errors="coerce").notna()]
    if measured.empty:
        return None
    panels = [name for name in GPU_PANELS
              if pd.to_numeric(measured[name], errors="coerce").notna().any()]
    profiles = profiles_in(levels, baseline)
    colors = _colors(profiles)
    fig, hosts, axes = _hosts_grid(measured, len(panels), 3.6)
    for row, host in enumerate(hosts):
        host_rows = measured[measured["host"] == host]
        for col, name in enumerate(panels):
            ax = axes[row][col]
            for profile in profiles:
                rows = host_rows[host_rows["profile"] == profile].sort_values("concurrency")
                values = pd.to_numeric(rows[name], errors="coerce")
                if values.notna().any():
                    ax.plot(rows["concurrency"], values, marker="o", ms=4,
                            color=colors[profile], label=profile)
                    bad = rows[~rows["usable"]]
                    if not bad.empty:
                        _excluded(ax, bad["concurrency"], pd.to_numeric(bad[name], errors="coerce"),
                                  colors[profile], f"{profile}: excluded level")
            _concurrency_axis(ax, sorted(host_rows["concurrency"].unique().tolist()))
            ax.set_ylabel(f"{_header(name)} ({_unit(name)})")
            ax.set_title(f"{_header(name)} vs concurrency: {host}", fontsize=10)
            ax.legend(fontsize=7)
    _badge(fig, badge)
    return _png(fig)
