"""plots/derived.png: each derived profile's curve beside the two static ones and their envelope
(top), and the derived profile's share of the envelope per level (bottom), collapses marked."""
from __future__ import annotations

from ansible_collections.servelab.serving.plugins.plugin_utils.report.plots import (
    Figure,
    _badge,
    _concurrency_axis,
    _png,
)


def plot_derived(results: list, badge: str | None = None) -> bytes | None:
    if not results or Figure is None:
        return None
    fig = Figure(figsize=(6.4 * len(results), 7.2), layout="constrained")
    axes = fig.subplots(2, len(results), squeeze=False)
    for col, r in enumerate(results):
        top, bottom = axes[0][col], axes[1][col]
        levels = [lv for lv in r.levels if lv.derived_tok_s is not None]
        cs = [lv.concurrency for lv in levels]
        for name, values, style in (
                (r.source, [lv.source_tok_s for lv in levels], "s--"),
                (r.baseline, [lv.baseline_tok_s for lv in levels], "^--"),
                (f"{r.profile} (derived)", [lv.derived_tok_s for lv in levels], "o-")):
            pts = [(c, v) for c, v in zip(cs, values) if v is not None]
            if pts:
                top.plot([p[0] for p in pts], [p[1] for p in pts], style, ms=4, label=name)
        env = [(lv.concurrency, lv.envelope_tok_s) for lv in levels if lv.envelope_tok_s]
        if env:
            top.plot([p[0] for p in env], [p[1] for p in env], color="grey", lw=6, alpha=0.25,
                     label="envelope (better static)")
        collapsed = [lv for lv in levels if lv.collapse]
        if collapsed:
            top.scatter([lv.concurrency for lv in collapsed],
                        [lv.derived_tok_s for lv in collapsed], marker="X", s=90, color="red",
                        zorder=4, label="collapse: below both static")
        title = f"{r.profile} on {r.host}"
        if r.assumption:
            title += "\n(split halves: assumed curves, not a field fit)"
        top.set_title(title, fontsize=9)
        top.set_ylabel("output tok/s")
        top.legend(fontsize=7)
        if cs:
            _concurrency_axis(top, cs)
        ratio = [(lv.concurrency, 100 * lv.envelope_ratio) for lv in levels
                 if lv.envelope_ratio is not None]
        if ratio:
            colors = ["red" if lv.collapse else ("tab:green" if lv.reached else "tab:orange")
                      for lv in levels if lv.envelope_ratio is not None]
            bottom.scatter([p[0] for p in ratio], [p[1] for p in ratio], c=colors, s=40,
                           zorder=3)
            bottom.plot([p[0] for p in ratio], [p[1] for p in ratio], color="grey", lw=1)
            for c, v in ratio:
                bottom.annotate(f"{v:.0f}%", (c, v), textcoords="offset points", xytext=(0, 6),
                                ha="center", fontsize=7)
            _concurrency_axis(bottom, [p[0] for p in ratio])
            # At least 90-110 %: a flat 100 % line must not be zoomed into noise.
            values = [p[1] for p in ratio]
            bottom.set_ylim(min(min(values) - 5, 90), max(max(values) + 5, 110))
        bottom.axhline(100, color="grey", ls=":")
        bottom.set_ylabel("% of the envelope (green: reached within CIs)")
    _badge(fig, badge)
    return _png(fig)
