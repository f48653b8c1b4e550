"""The report of a run over several GPU servers (a fleet): the hosts side by side and summed, the
hosts that disagree, and where each host's run stands.

    view = fleet_view(levels, manifest, baseline)    # None for a run of one host
    fleet_sections(view)                             # [(title, Table)] for render's sections
    plot_fleet(view, badge)                          # plots/fleet.png

- The fleet table: per profile and level, each host's output tok/s ± CI95 and their sum over
  the hosts whose level is usable (level_verdict's rule, as everywhere in the report), the sum's
  CI95 combining the hosts' half-widths in quadrature (the hosts are measured independently, as
  compare_runs treats two runs), and which hosts were left out of the sum and why. A host whose
  profile list (host_vars) does not have the profile is not "missing" from its sum.
- Disagreement: two hosts disagree at a (profile, level) when both levels are usable and their
  output tok/s are not a tie by the report's one rule (analysis.is_tie: within the two 95%
  half-widths together; with repeats, the half-widths across them). Levels without a CI are not
  judged. Same hardware and settings should agree; a host that does not is named with the
  levels and the gap, so a slow GPU, a throttled host or a different driver is seen rather than
  averaged away.
- Host status: each GPU server of the run (manifest `gpu_servers`), its profiles (its own list,
  manifest `hosts.<host>.bench.profiles`), which finished, which failed in which task, which
  never started: one host failing is named without hiding the others' results.

Controller only (pandas, matplotlib), like the rest of report/; figures are titled and formatted
from results/levels.py's FIELDS through level_views.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

try:
    import pandas as pd
except ImportError:  # pragma: no cover - checked by the action plugin
    pd = None

from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import (
    MISSING,
    cell_header,
    format_value,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    FIELD,
    LAYOUTS,
    VIEW_TABLE,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import (
    exclusion_reason,
    finite_number,
    is_tie,
    profiles_in,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.context import profile_records
from ansible_collections.servelab.serving.plugins.plugin_utils.report.intervals import clipped_yerr
from ansible_collections.servelab.serving.plugins.plugin_utils.report.plots import (
    Figure,
    _badge,
    _colors,
    _concurrency_axis,
    _png,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.render import Table

FLEET_PLOT = "fleet.png"
NOT_PLANNED = "not in its profiles"


@dataclass
class HostLevel:
    """One host's figures at one (profile, level) of the fleet table."""
    host: str
    output_tok_s: float | None
    ci95: float | None
    request_s: float | None
    usable: bool
    why: str = ""          # why it is not in the sum: failed, client-limited, missing, ...


@dataclass
class FleetRow:
    profile: str
    concurrency: int
    hosts: list            # HostLevel per host that has the profile (measured or planned)
    total_tok_s: float | None
    total_ci95: float | None
    total_request_s: float | None
    summed: list           # hosts in the sum
    left_out: list         # (host, why) of the hosts that have the profile but no usable level


@dataclass
class Disagreement:
    """Two hosts at odds on one profile: the levels where their CIs do not overlap."""
    profile: str
    low_host: str
    high_host: str
    levels: list           # (concurrency, low tok/s, low ci, high tok/s, high ci)

    @property
    def gap_pct(self) -> tuple:
        """(smallest, largest) gap in % of the lower host's figure."""
        gaps = [100.0 * (high - low) / low for _c, low, _lci, high, _hci in self.levels if low]
        return (min(gaps), max(gaps)) if gaps else (None, None)

    def text(self) -> str:
        name = FIELD["output_tok_s"]
        cs = ", ".join(format_value("concurrency", c) for c, *_rest in self.levels)
        low, high = self.gap_pct
        by = "" if low is None else (
            f" by {low:.1f}%" if round(low, 1) == round(high, 1) else f" by {low:.1f}-{high:.1f}%")
        detail = "; ".join(
            f"C={format_value('concurrency', c)}: {self.high_host} "
            f"{format_value('output_tok_s', hi)} ± {format_value('output_tok_s_ci95', hci)} vs "
            f"{self.low_host} {format_value('output_tok_s', lo)} ± "
            f"{format_value('output_tok_s_ci95', lci)} {name.unit}"
            for c, lo, lci, hi, hci in self.levels)
        return (f"{self.profile}: {self.high_host} is above {self.low_host} at "
                f"{FIELD['concurrency'].header}={cs}{by} in {name.title}, outside each other's "
                f"95% CIs ({detail})")


@dataclass
class HostStatus:
    host: str
    planned: list                   # its profile list
    finished: list
    failed: list                    # (profile, task, error)
    not_finished: list              # started and never finished (the host died, run cut short)
    never_started: list
    levels: int                     # closed-loop levels measured
    usable_levels: int

    @property
    def ok(self) -> bool:
        return not (self.failed or self.not_finished or self.never_started) and bool(self.planned)


@dataclass
class FleetView:
    hosts: list
    rows: list = field(default_factory=list)
    disagreements: list = field(default_factory=list)
    statuses: list = field(default_factory=list)
    judged: int = 0                 # (profile, level, host pair)s compared
    unjudged: int = 0               # (profile, level, host pair)s without a CI on a side

    def as_dict(self) -> dict:
        """What bench_report returns (the action's `fleet`)."""
        return {
            "hosts": list(self.hosts),
            "rows": [asdict(r) for r in self.rows],
            "disagreements": [dict(asdict(d), text=d.text()) for d in self.disagreements],
            "hosts_failed": [s.host for s in self.statuses if not s.ok],
        }


# ---------------------------------------------------------------------------------------------
# The figures


def _planned_profiles(manifest: dict) -> dict:
    """{host: [profile, ...]} as each host's bench settings list them (its own list)."""
    hosts = manifest.get("hosts") if isinstance(manifest.get("hosts"), dict) else {}
    out = {}
    for host, info in hosts.items():
        bench = info.get("bench") if isinstance(info, dict) else None
        names = bench.get("profiles") if isinstance(bench, dict) else None
        if isinstance(names, list):
            out[str(host)] = [str(n) for n in names]
    return out


def _run_hosts(levels: pd.DataFrame, manifest: dict) -> list:
    listed = manifest.get("gpu_servers") if isinstance(manifest.get("gpu_servers"), list) else []
    return sorted({str(h) for h in listed} | set(levels["host"].astype(str))
                  | set(_planned_profiles(manifest)))


def _host_level(host: str, row) -> HostLevel:
    if row is None:
        return HostLevel(host, None, None, None, False, "missing")
    tok_s = finite_number(row["output_tok_s"])
    usable = bool(row["usable"]) and tok_s is not None
    return HostLevel(host, tok_s, finite_number(row.get("output_tok_s_ci95")),
                     finite_number(row.get("request_s")), usable,
                     "" if usable else (exclusion_reason(row) or "no figure"))


def _fleet_row(profile: str, c: int, cells: list) -> FleetRow:
    summed = [h for h in cells if h.usable]
    cis = [h.ci95 for h in summed]
    total = sum(h.output_tok_s for h in summed) if summed else None
    total_ci = math.sqrt(sum(ci * ci for ci in cis)) if summed and None not in cis else None
    rates = [h.request_s for h in summed]
    total_rate = sum(rates) if summed and None not in rates else None
    return FleetRow(profile, c, cells, total, total_ci, total_rate, [h.host for h in summed],
                    [(h.host, h.why) for h in cells if not h.usable])


def _disagreements(rows: list) -> tuple[list, int, int]:
    pairs: dict = {}
    judged = unjudged = 0
    for row in rows:
        usable = [h for h in row.hosts if h.usable]
        for i, a in enumerate(usable):
            for b in usable[i + 1:]:
                # The report's one tie rule (the tables' `~`): within the two half-widths.
                tie = is_tie(a.output_tok_s, a.ci95, b.output_tok_s, b.ci95)
                if tie is None:
                    unjudged += 1
                    continue
                judged += 1
                if tie:
                    continue
                low, high = (a, b) if a.output_tok_s < b.output_tok_s else (b, a)
                entry = pairs.setdefault((row.profile, low.host, high.host),
                                         Disagreement(row.profile, low.host, high.host, []))
                entry.levels.append((row.concurrency, low.output_tok_s, low.ci95,
                                     high.output_tok_s, high.ci95))
    return list(pairs.values()), judged, unjudged


def _statuses(hosts: list, levels: pd.DataFrame, manifest: dict) -> list:
    planned = _planned_profiles(manifest)
    # context.profile_records: the manifest's per-profile records, errors redacted once more
    # (the report is the file people mail); a flat record (host "*") is every host's.
    records = {(r.profile, r.host): r for r in profile_records(manifest)}
    out = []
    for host in hosts:
        host_rows = levels[levels["host"] == host]
        names = planned.get(host) or list(dict.fromkeys(host_rows["profile"].tolist()))
        status = HostStatus(host, list(names), [], [], [], [], len(host_rows),
                            int(host_rows["usable"].sum()) if not host_rows.empty else 0)
        for profile in names:
            record = records.get((profile, host)) or records.get((profile, "*"))
            state = (record.status or "") if record is not None else ""
            if state == "finished":
                status.finished.append(profile)
            elif state == "failed":
                status.failed.append((profile, record.failed_task or "", record.error or ""))
            elif state:
                status.not_finished.append(profile)
            else:
                status.never_started.append(profile)
        out.append(status)
    return out


def fleet_view(levels: pd.DataFrame, manifest: dict, baseline: str) -> FleetView | None:
    """The fleet sections' data; None for a run of one GPU server (nothing to sum or compare).
    `levels`: the report's closed-loop frame (data.load_run: usable, note, verdict)."""
    manifest = manifest if isinstance(manifest, dict) else {}
    hosts = _run_hosts(levels, manifest)
    if len(hosts) < 2:
        return None
    planned = _planned_profiles(manifest)
    rows = []
    by_key = {(str(r["host"]), str(r["profile"]), int(r["concurrency"])): r
              for _key, r in levels.iterrows()}
    for profile in profiles_in(levels, baseline):
        # A host has the profile when its own list names it, or (no list recorded) it measured it.
        having = [h for h in hosts
                  if profile in planned.get(h, [])
                  or (h not in planned and ((levels["host"] == h) & (levels["profile"] == profile)).any())]
        measured = levels[levels["profile"] == profile]["concurrency"]
        for c in sorted({int(c) for c in measured}):
            cells = [_host_level(h, by_key.get((h, profile, c))) for h in having]
            rows.append(_fleet_row(profile, c, cells))
    view = FleetView(hosts=hosts, rows=rows, statuses=_statuses(hosts, levels, manifest))
    view.disagreements, view.judged, view.unjudged = _disagreements(rows)
    return view


# ---------------------------------------------------------------------------------------------
# Tables and text


def _tok_s_cell(tok_s, ci) -> str:
    value = format_value("output_tok_s", tok_s)
    if value == MISSING or ci is None:
        return value
    return f"{value} ± {format_value('output_tok_s_ci95', ci)}"


def _host_cell(level: HostLevel) -> str:
    """A host's cell: its figure ± CI95; in brackets when not summed, with the reason (and the
    figure, where a level that did not fail has one: client-limited, too many errors)."""
    if level.usable:
        return _tok_s_cell(level.output_tok_s, level.ci95)
    if level.output_tok_s is None or level.why == "failed":
        return f"({level.why})"
    return f"({format_value('output_tok_s', level.output_tok_s)}, {level.why})"


def fleet_table(view: FleetView) -> Table:
    """Per (profile, level): each host's output tok/s ± CI95, then their sum."""
    tok_s = cell_header(LAYOUTS[VIEW_TABLE][0])           # "output tok/s ± CI95"
    headers = ([FIELD["profile"].title, FIELD["concurrency"].title] + list(view.hosts)
               + [f"fleet {tok_s}", f"fleet {FIELD['request_s'].title}", "hosts summed"])
    # A host that recorded no profile at all (it failed before its first) is not "without" one.
    absent = {s.host: "(no profile recorded)" for s in view.statuses if not s.planned}
    rows = []
    for row in view.rows:
        cells = {h.host: _host_cell(h) for h in row.hosts}
        summed = f"{len(row.summed)} of {len(row.hosts)}"
        if row.left_out:
            summed += ": without " + ", ".join(f"{h} ({why})" for h, why in row.left_out)
        rows.append([row.profile, format_value("concurrency", row.concurrency)]
                    + [cells.get(h, absent.get(h, f"({NOT_PLANNED})")) for h in view.hosts]
                    + [_tok_s_cell(row.total_tok_s, row.total_ci95),
                       format_value("request_s", row.total_request_s), summed])
    return Table(headers, rows, [
        f"Host columns: {tok_s} of the level on that host; in brackets: not summed (why). "
        f"fleet: the sum over the hosts whose level is usable, its CI95 the hosts' half-widths "
        f"combined in quadrature (hosts measured independently); '{NOT_PLANNED}': the host's "
        "own profile list (host_vars) does not have the profile."])


def status_table(view: FleetView) -> Table:
    headers = [FIELD["host"].title, "profiles", "finished", "failed (task: error)",
               "not finished", "levels usable/measured"]
    rows = []
    for s in view.statuses:
        failed = "; ".join(f"{p} in '{task}': {error[:160]}" if task else f"{p}: {error[:160]}"
                           for p, task, error in s.failed)
        rows.append([s.host, ", ".join(s.planned) or MISSING, ", ".join(s.finished) or MISSING,
                     failed or MISSING,
                     ", ".join(s.not_finished + [f"{p} (never started)" for p in s.never_started])
                     or MISSING,
                     f"{s.usable_levels}/{s.levels}"])
    return Table(headers, rows)


def failed_hosts_line(view: FleetView) -> str | None:
    bad = [s for s in view.statuses if not s.ok]
    if not bad:
        return None
    parts = []
    for s in bad:
        what = [f"{p} failed" + (f" in '{task}'" if task else "") for p, task, _e in s.failed]
        what += [f"{p} did not finish" for p in s.not_finished]
        what += [f"{p} never started" for p in s.never_started]
        if not s.planned:
            what.append("no profile recorded (the host failed or was unreachable before its "
                        "first profile)")
        parts.append(f"{s.host}: {', '.join(what)}")
    others = [s.host for s in view.statuses if s.ok]
    return ("Hosts where a profile did not finish: " + "; ".join(parts) + ". "
            + (f"The other hosts' results ({', '.join(others)}) are whole." if others else ""))


DISAGREE_RULE = ("Two hosts disagree at a profile and level when both levels are usable and "
                 "their output tok/s differ by more than their two 95% half-widths together "
                 "(outside each other's CIs); gap: in % of the lower host's figure.")


def disagreement_table(view: FleetView) -> Table:
    """One row per (profile, host pair, level) where two hosts disagree."""
    tok_s = cell_header(LAYOUTS[VIEW_TABLE][0])           # "output tok/s ± CI95"
    headers = [FIELD["profile"].title, "higher host", "lower host", FIELD["concurrency"].title,
               "gap", f"higher {tok_s}", f"lower {tok_s}"]
    rows = []
    for d in view.disagreements:
        for c, low, low_ci, high, high_ci in d.levels:
            gap = f"+{100.0 * (high - low) / low:.1f}%" if low else MISSING
            rows.append([d.profile, d.high_host, d.low_host, format_value("concurrency", c), gap,
                         _tok_s_cell(high, high_ci), _tok_s_cell(low, low_ci)])
    notes = [DISAGREE_RULE]
    if not view.judged:
        notes.append("No profile and level has usable figures with a CI95 on two hosts: "
                     "nothing to compare.")
    elif not rows:
        notes.append("No two hosts disagree: at every profile and level measured usable on two "
                     "or more hosts, their output tok/s are within each other's 95% CIs.")
    if view.unjudged:
        notes.append(f"{view.unjudged} host pair(s) at a level were not compared: a level "
                     "without a CI95 (too few batches in its window).")
    return Table(headers, rows, notes)


def fleet_sections(view: FleetView | None) -> list:
    """The report's fleet sections, [(title, Table)] (render.py's `sections` hook): where each
    host stands, the fleet table, the hosts that disagree; none for a run of one host."""
    if view is None:
        return []
    status = status_table(view)
    line = failed_hosts_line(view)
    if line:
        status.footnotes.append(line)
    out = [(f"Fleet: {len(view.hosts)} GPU servers", status)]
    if view.rows:
        out.append(("Fleet: output tok/s per host and summed", fleet_table(view)))
    out.append(("Fleet: hosts that disagree", disagreement_table(view)))
    return out


# ---------------------------------------------------------------------------------------------
# The plot


def plot_fleet(view: FleetView | None, badge: str | None = None) -> bytes | None:
    """One row per profile: each host's output tok/s ± CI95 against concurrency (a ring marks a
    level where the host disagrees with another), and the fleet sum stacked by host."""
    if view is None or not view.rows or Figure is None:
        return None
    profiles = list(dict.fromkeys(r.profile for r in view.rows))
    colors = _colors(view.hosts)
    odd = {(d.profile, host, c) for d in view.disagreements
           for host in (d.low_host, d.high_host) for c, *_rest in d.levels}
    fig = Figure(figsize=(12.8, 3.8 * len(profiles)), layout="constrained")
    axes = fig.subplots(len(profiles), 2, squeeze=False)
    for i, profile in enumerate(profiles):
        rows = [r for r in view.rows if r.profile == profile]
        levels = [r.concurrency for r in rows]
        per_host, stacked = axes[i][0], axes[i][1]
        bottom = [0.0] * len(rows)
        ring_label = "disagrees with another host (CI95s apart)"
        for host in view.hosts:
            points = [(r.concurrency, h) for r in rows for h in r.hosts
                      if h.host == host and h.usable]
            if points:
                per_host.errorbar([c for c, _h in points], [h.output_tok_s for _c, h in points],
                                  yerr=clipped_yerr([h.output_tok_s for _c, h in points],
                                                    [h.ci95 for _c, h in points]),
                                  marker="o", ms=4,
                                  capsize=3, color=colors[host], label=host)
                rings = [(c, h.output_tok_s) for c, h in points if (profile, host, c) in odd]
                if rings:
                    per_host.scatter([c for c, _v in rings], [v for _c, v in rings], s=160,
                                     facecolors="none", edgecolors="red", zorder=4,
                                     label=ring_label)
                    ring_label = None     # one legend entry for every ring
            heights = [next((h.output_tok_s for h in r.hosts if h.host == host and h.usable), 0.0)
                       for r in rows]
            if any(heights):
                stacked.bar([str(c) for c in levels], heights, bottom=bottom, color=colors[host],
                            label=host)
                bottom = [b + v for b, v in zip(bottom, heights, strict=True)]
        _concurrency_axis(per_host, levels)
        unit = FIELD["output_tok_s"].unit
        per_host.set_ylabel(f"{FIELD['output_tok_s'].header} ({unit})")
        per_host.set_title(f"{profile}: per host, ± CI95", fontsize=10)
        per_host.legend(fontsize=7)
        stacked.set_xlabel("concurrency (closed loop, per host)")
        stacked.set_ylabel(f"fleet {FIELD['output_tok_s'].header} ({unit})")
        stacked.set_title(f"{profile}: summed over the hosts (usable levels)", fontsize=10)
        stacked.grid(True, axis="y", alpha=0.3)
        stacked.legend(fontsize=7)
    _badge(fig, badge)
    return _png(fig)
