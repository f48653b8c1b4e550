"""The report of a tune (tune.yml): what it searched, how it ended, the best profile as YAML,
every trial's row with the prediction it was proposed with beside what was measured, the
goodput-vs-latency Pareto frontier over every level the trials measured (a table and
plots/tune_pareto.png), and the combinations refused before the first trial.

Read from the run directory alone (tune/state.json, the part files): `servelab report`, the end
of tune.yml and the interrupt cleanup (playbooks/bench_interrupted.yml) all render it the same.
Controller only (matplotlib for the plot).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import TUNE_DIR
from ansible_collections.servelab.serving.plugins.plugin_utils.report.table import Table
from ansible_collections.servelab.serving.plugins.plugin_utils.tune import state as st
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.objective import Objective
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.results import (
    BEST_YML, best_document, pareto_points, trial_rows,
)

PLOT = "tune_pareto.png"
PLOT_TITLE = "Tune: goodput against TTFT over every trial's levels (Pareto frontier)"


@dataclass
class TuneView:
    run_id: str
    state: st.TuneState
    objective: Objective
    rows: List[dict]
    pareto: List[dict]
    best_yaml: Optional[str]
    refused: List[dict] = field(default_factory=list)

    @property
    def best(self) -> Optional[st.Trial]:
        return self.state.best()

    @property
    def latency_column(self) -> str:
        return self.objective.slo_column("ttft_ms")


def read_tune(results_dir: str, rows_by_profile: Dict[str, List[dict]],
              manifest: dict, run_id: Optional[str] = None) -> Optional[TuneView]:
    """The tune's view of a run directory; None for a run that is not a tune."""
    try:
        state = st.load(results_dir)
    except st.StateError:
        return None
    if state is None:
        return None
    run_id = run_id or os.path.basename(os.path.realpath(results_dir))
    refused = list(((manifest or {}).get("tune") or {}).get("refused") or [])
    return TuneView(run_id=run_id, state=state,
                    objective=Objective.parse(state.settings["objective"]),
                    rows=trial_rows(state), pareto=pareto_points(state, rows_by_profile),
                    best_yaml=best_document(state, run_id), refused=refused)


def baseline_for(view: TuneView) -> Optional[str]:
    """The profile the report's speedups are against in a tune: the best trial (else the first)."""
    best = view.best
    if best is not None:
        return best.name
    return view.state.trials[0].name if view.state.trials else None


def summary_lines(view: TuneView) -> List[str]:
    s = view.state.settings
    counts = {}
    for t in view.state.trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    space = s.get("space") or {}
    grid = 1
    for values in space.values():
        grid *= len(values)
    lines = [
        "objective: %s" % view.objective.describe(),
        "searched on %s (%s engine), over the %s: %s (%d combinations, %d refused by the "
        "engine's rules); strategy %s" % (
            s.get("host"), s.get("engine"), "request rate" if s.get("axis") == "rate"
            else "concurrency", ", ".join("%s %s" % (f[2:], v) for f, v in space.items()), grid,
            len(s.get("refused") or ()), s.get("strategy")),
        "trials: %d (%s); %d level(s), %.0f s measured, %.0f s in trials (server starts "
        "included)" % (len(view.state.trials),
                       ", ".join("%d %s" % (n, k) for k, n in sorted(counts.items())),
                       sum(t.levels for t in view.state.trials),
                       sum(t.measured_s for t in view.state.trials),
                       view.state.wall_seconds()),
    ]
    best = view.best
    if best is not None:
        out = best.outcome or {}
        ci = " +- %.3g" % best.score_ci95 if best.score_ci95 else ""
        if best.lower_bound:
            capacity = ("a lower bound: its capacity is at least %s, the search ended before it "
                        "bracketed the capacity within the tolerance (%s)"
                        % (_load(s, out.get("best_x")), best.reason))
        else:
            capacity = "its capacity lies in [%s, %s)" % (_load(s, out.get("lo")),
                                                          _load(s, out.get("hi")))
        lines.append("best: %s (%s): %.4g %s%s at %s; %s%s" % (
            best.name, best.key, best.score, view.objective.unit, ci,
            _load(s, out.get("best_x")), capacity, _tie_note(view)))
    else:
        lines.append("best: none - %s" % no_score_words(view.rows, s))
    running = view.state.running()
    if running is not None:
        lines.append("interrupted: trial %s (%s) was in flight; resuming the run (-e "
                     "bench_resume=%s) runs it again, keeping its finished levels"
                     % (running.name, running.key, view.run_id))
    elif view.state.done:
        lines.append("ended: %s" % view.state.done)
    model = view.state.model or {}
    if model.get("note") or model.get("model"):
        lines.append("model: %s" % (model.get("note") or model.get("model")))
    return lines


def no_score_words(rows, settings) -> str:
    """Why no trial has a score, as the levels say it: loads met the SLO (the highest named)
    yet no trial ended with a score (out of levels before a full-length level met it, a
    full-length level missed, the server died: each trial's reason says which), no load met it
    at all, every trial failed, or no trial ended. tune.yml's failure says the same."""
    met = [r.get("highest_load_met") for r in rows if r.get("highest_load_met") is not None]
    if met:
        return ("no trial ended with a score, though loads up to %s met the SLO (each trial's "
                "reason says why)" % _load(settings, max(met)))
    if any(r.get("status") in (st.NO_SCORE, st.PRUNED) for r in rows):
        return "no load any trial measured met the SLO"
    if rows and all(r.get("status") == st.FAILED for r in rows):
        return "every trial failed (how each ended says why)"
    return "no trial has ended yet"


def _load(settings, x) -> str:
    if x is None:
        return "-"
    return ("rate %g/s" % x) if settings.get("axis") == "rate" else ("C=%d" % int(x))


def _tie_note(view: TuneView) -> str:
    """The runner-up, when its score is within the two 95% half-widths: a tie, not a win."""
    scored = sorted((t for t in view.state.trials if t.status == st.FINISHED and t.score),
                    key=lambda t: -t.score)
    if len(scored) < 2:
        return ""
    a, b = scored[0], scored[1]
    if a.score_ci95 is None or b.score_ci95 is None:
        return ""
    if a.score - b.score <= a.score_ci95 + b.score_ci95:
        return ("; %s (%s, %.4g) is within the two 95%% half-widths: a tie on this evidence"
                % (b.name, b.key, b.score))
    return ""


def _cell(value, fmt: str = "%.4g") -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return fmt % value
    return str(value)


def trials_table(view: TuneView) -> Table:
    flags = [f[2:] for f in (view.state.settings.get("space") or {})]
    headers = (["trial", "status"] + flags
               + ["score (%s)" % view.objective.unit, "+-95%", "predicted", "pred. error",
                  "load", "capacity bracket", "levels (short/full)", "measured s", "why",
                  "how it ended"])
    rows = []
    for r in view.rows:
        err = r.get("prediction_error_pct")
        rows.append([r["trial"], r["status"]] + [_cell(r.get(f)) for f in flags] + [
            (">= " if r.get("lower_bound") else "") + _cell(r.get("score")),
            _cell(r.get("score_ci95"), "%.2g"), _cell(r.get("predicted")),
            "-" if err is None else "%+.0f%%" % err, _cell(r.get("load")),
            "[%s, %s)" % (_cell(r.get("capacity_lo")), _cell(r.get("capacity_hi"))),
            "%s (%s/%s)" % (r.get("levels"), _cell(r.get("short_levels")),
                            _cell(r.get("full_levels"))),
            _cell(r.get("measured_s"), "%.1f"), r.get("why") or "", r.get("reason") or ""])
    return Table(headers, rows, [
        "score: the objective at the trial's best full-length level that met the SLO (a lower "
        "bound, marked >=, where the search ended before it bracketed the capacity within the "
        "tolerance); "
        "+-95%: "
        "that level's batch-means half-width of output tok/s, relative, applied to the score; "
        "predicted: what the proposer expected when it chose the trial (the model corrected by "
        "the trials before it); the capacity bracket: the highest load that met the SLO and the "
        "lowest that missed it."])


def pareto_table(view: TuneView) -> Table:
    col = view.latency_column
    rows = [[p["trial"], p["flags"], _cell(p["load"]), "%.1f" % p[col],
             "%.4g" % p["goodput_request_s"], "yes" if p["meets_slo"] else "no"]
            for p in view.pareto if p["frontier"]]
    return Table(["trial", "flags", "load", col.replace("_", " "), "goodput req/s",
                  "meets SLO"], rows,
                 ["The frontier over every usable level of every trial: no other level has at "
                  "least its goodput at a lower %s." % col.replace("_", " ")])


def refused_table(view: TuneView) -> Optional[Table]:
    if not view.refused:
        return None
    return Table(["flags", "left out", "why"],
                 [[r.get("key", ""), r.get("kind", "refused"), r.get("reason", "")]
                  for r in view.refused],
                 ["refused: the engine would not run it (its own rules, with the release's "
                  "file:line); same server: the engine runs it as an earlier candidate, which "
                  "is tried instead."])


def sections(view: TuneView) -> list:
    out = [("Tune: trials (prediction beside measurement)", trials_table(view)),
           ("Tune: Pareto frontier (goodput vs %s)" % view.latency_column.replace("_", " "),
            pareto_table(view))]
    refused = refused_table(view)
    if refused is not None:
        out.append(("Tune: combinations refused before the first trial", refused))
    return out


def best_block(view: TuneView) -> str:
    if view.best_yaml is None:
        return ""
    return "%s/%s:\n%s" % (TUNE_DIR, BEST_YML, view.best_yaml)


def plot(view: TuneView) -> Optional[bytes]:
    """Goodput against the objective's TTFT percentile, every usable level of every trial, the
    frontier drawn, the best trial's levels marked, the TTFT limit as a line."""
    if not view.pareto:
        return None
    # pylint: disable-next=import-outside-toplevel
    from ansible_collections.servelab.serving.plugins.plugin_utils.report.plots import (
        Figure, _png,
    )
    col = view.latency_column
    fig = Figure(figsize=(8.0, 5.4), layout="constrained")
    ax = fig.subplots()
    best = view.best.name if view.best is not None else None
    ok = [p for p in view.pareto if p["meets_slo"]]
    missed = [p for p in view.pareto if not p["meets_slo"]]
    ax.scatter([p[col] for p in ok], [p["goodput_request_s"] for p in ok], s=18,
               color="#4a7", label="levels that met the SLO")
    ax.scatter([p[col] for p in missed], [p["goodput_request_s"] for p in missed], s=18,
               color="#bbb", label="levels that missed it")
    front = [p for p in view.pareto if p["frontier"]]
    ax.plot([p[col] for p in front], [p["goodput_request_s"] for p in front], color="black",
            lw=2, alpha=0.4, drawstyle="steps-post", label="Pareto frontier")
    mine = [p for p in view.pareto if p["trial"] == best]
    if mine:
        ax.scatter([p[col] for p in mine], [p["goodput_request_s"] for p in mine], s=80,
                   facecolors="none", edgecolors="#c33", lw=1.5, label="best trial %s" % best)
    limit = view.objective.slo.get("ttft_ms")
    if limit:
        ax.axvline(limit, color="#c33", ls="--", lw=1, label="TTFT limit %g ms" % limit)
    ax.set_xscale("log")
    ax.set_xlabel("%s (ms, log)" % col.replace("_", " "))
    ax.set_ylabel("goodput (requests/s that met every SLO)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)
