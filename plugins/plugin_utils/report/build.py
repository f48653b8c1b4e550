"""bench_report's logic: one run's results -> summary.md, report.html, plots/*.png, and the data.

    report = build_report("results/latest", baseline="baseline")
    written = write_report(report)            # atomic; only files whose bytes changed

Importable alone (pandas + matplotlib on the controller); the action plugin is a thin wrapper.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field

from ansible_collections.servelab.serving.plugins.plugin_utils.report import analysis
from ansible_collections.servelab.serving.plugins.plugin_utils.report import compare
from ansible_collections.servelab.serving.plugins.plugin_utils.report import figures as figure_data
from ansible_collections.servelab.serving.plugins.plugin_utils.report import distributions
from ansible_collections.servelab.serving.plugins.plugin_utils.report import export
from ansible_collections.servelab.serving.plugins.plugin_utils.report import fleet
from ansible_collections.servelab.serving.plugins.plugin_utils.report import plots
from ansible_collections.servelab.serving.plugins.plugin_utils.report import percentile_table
from ansible_collections.servelab.serving.plugins.plugin_utils.report import schedule
from ansible_collections.servelab.serving.plugins.plugin_utils.report import schedule_plot
from ansible_collections.servelab.serving.plugins.plugin_utils.report import repeats
from ansible_collections.servelab.serving.plugins.plugin_utils.report import telemetry
from ansible_collections.servelab.serving.plugins.plugin_utils.report import tune_section
from ansible_collections.servelab.serving.plugins.plugin_utils.report.context import run_context
from ansible_collections.servelab.serving.plugins.plugin_utils.report.data import (
    DEFAULT_MAX_ERROR_RATE,
    ReportError,
    load_levels,
    load_run,
    split_load_modes,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.render import (
    ReportContent,
    crossover_summary,
    level_table,
    report_html,
    summary_markdown,
    to_markdown,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LEVELS,
    PARTS_DIR,
    PLOTS_DIR,
    REPORT_HTML,
    SUMMARY,
    write_if_changed,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    PartError,
    levels_csv,
    part_stem,
    read_parts,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import ManifestError, run_lock

PLOT_FILES = ("throughput.png", "latency.png", "speedup.png", "comparison.png", "pareto.png",
              "ttft_cdf.png", "itl_cdf.png", "rate.png", "gpu.png", "derived.png",
              fleet.FLEET_PLOT, tune_section.PLOT)

__all__ = ["ReportError", "ReportResult", "build_report", "write_report"]


@dataclass
class ReportResult:
    results_dir: str
    run_id: str
    baseline: str
    table: str  # the side-by-side level table, Markdown
    crossover: dict  # {profile: {host: C or None}}
    crossover_details: list  # Crossover as dicts (status, bracket, estimate, text)
    speedup: list  # SpeedupPoint as dicts
    recommendation: str
    time_scale: str
    comparison: list
    notes: list
    warnings: list
    msg: str
    files: dict = field(default_factory=dict)  # relative path -> bytes (not returned to Ansible)
    # part stem -> the level's GPU telemetry columns (written into levels.csv by write_report)
    telemetry: dict = field(default_factory=dict)
    # each derived profile against its static ones (report/schedule.py)
    derived: list = field(default_factory=list)
    # repeats.LevelSpread as dicts, per level, when some level was measured more than once
    repeats: list = field(default_factory=list)
    # A run over several GPU servers: the fleet table, the hosts that disagree, the hosts that
    # failed (report/fleet.py FleetView.as_dict); None for one host.
    fleet: dict | None = None

    def as_result(self) -> dict:
        """What the action returns: everything but the file bytes and the telemetry by level,
        paths absolute."""
        data = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("files", "telemetry")
        }
        data["files"] = [os.path.join(self.results_dir, rel) for rel in sorted(self.files)]
        return data


OPEN_LOOP_ONLY = (
    "This run measured open-loop (request-rate) levels only: they are reported as measured (the "
    "rate table and plot), and the speedup, crossover and recommendation, which compare profiles "
    "over closed-loop concurrency levels, are not drawn."
)


def _notes(levels, baseline: str) -> list:
    if levels.empty:
        return [OPEN_LOOP_ONLY]
    profiles = analysis.profiles_in(levels, baseline)
    if len(profiles) == 1:
        return [f"Only one profile ({profiles[0]}) in this run: no speedup and no crossover."]
    if baseline not in profiles:
        return [
            f"The baseline profile `{baseline}` has no results in this run (profiles: "
            f"{', '.join(profiles)}): no speedup and no crossover. Pass `baseline:` naming one "
            "of them."
        ]
    notes = []
    for host, host_rows in levels.groupby("host", sort=True):
        if baseline not in set(host_rows["profile"]):
            notes.append(f"{host} has no {baseline} results: no speedup or crossover there.")
    return notes


def _join_telemetry(results_dir: str, run) -> tuple[dict, str | None]:
    """The GPU server's samples summarised per level (report/telemetry.py), merged into the
    typed rows the exports write and into the report's frames; (figures by part stem, the note
    where levels have none)."""
    gpu = telemetry.read_run_telemetry(results_dir)
    rows = run.records.rows if run.records is not None else []
    by_stem = {}
    for row in rows:
        figures = telemetry.level_figures(row, gpu)
        row.update(figures)
        by_stem[part_stem(row)] = figures
    for frame in (run.levels, run.rate_levels):
        if frame is None or frame.empty:
            continue
        keys = [part_stem(r) for r in frame.to_dict("records")]
        for name in telemetry.COLUMNS:
            values = [by_stem.get(k, {}).get(name) for k in keys]
            frame[name] = [float("nan") if v is None else float(v) for v in values]
    return by_stem, telemetry.note(gpu, rows)


def _tune_view(results_dir: str, run):
    """The tune's view (report/tune_section.py) when the run is a tune's, else None."""
    rows = run.records.rows if run.records is not None else []
    by_profile: dict = {}
    for row in rows:
        by_profile.setdefault(str(row.get("profile")), []).append(row)
    return tune_section.read_tune(results_dir, by_profile, run.manifest, run.run_id)


def build_report(
    results_dir: str,
    baseline: str = "baseline",
    compare_to: str | None = None,
    with_plots: bool = True,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
    cdf_levels: list | None = None,
) -> ReportResult:
    """Read the run, compute, render; nothing is written (see write_report).

    cdf_levels: the concurrencies of the TTFT/ITL CDF plots (default: each host's lowest and
    highest level and the crossovers' brackets)."""
    if compare_to and not os.path.isdir(compare_to):
        raise ReportError(
            f"compare_to {compare_to} is not a directory; pass an earlier "
            "results/<run_id>, or leave compare_to out"
        )
    run = load_run(results_dir, max_error_rate)
    tune = _tune_view(results_dir, run)
    if tune is not None and (not isinstance(baseline, str) or not baseline.strip()
                             or baseline not in tune.state.tried_names()):
        # A tune's profiles are its trials: speedups are against the best (else the first).
        baseline = tune_section.baseline_for(tune) or baseline
    if not isinstance(baseline, str) or not baseline.strip():
        raise ReportError("baseline must name a profile (default `baseline`)")
    gpu_figures, gpu_note = _join_telemetry(results_dir, run)
    # One row per level from here on: the mean of its repeats and their spread (repeats.py).
    repeats.summarise_run(run)
    levels = run.levels
    speedup = analysis.compute_speedup(levels, baseline)
    crossovers = analysis.compute_crossover(levels, baseline)
    measured = set(zip(levels["profile"], levels["host"], strict=True))
    if run.rate_levels is not None:
        measured |= set(zip(run.rate_levels["profile"], run.rate_levels["host"], strict=True))
    context = run_context(run.manifest, run.run_id, measured)
    # What the manifest says (a profile failed or never finished, its command line) bears on
    # the recommendation as much as the level rows do.
    _per_host, recommendation = analysis.recommend(
        levels,
        baseline,
        crossovers,
        failing=analysis.failing_profiles(levels, context.records),
        speculative=analysis.speculative_profiles(levels, context.records),
        records=context.records,
    )
    if levels.empty:
        recommendation = OPEN_LOOP_ONLY
    warnings = list(run.warnings)
    derived = schedule.analyse_derived(levels, run.manifest)

    comparison, comparison_note = [], ""
    if compare_to:
        if os.path.realpath(compare_to) == os.path.realpath(results_dir):
            warnings.append("compare_to is this run itself; every change is zero")
        earlier, _unused = load_levels(compare_to, max_error_rate)
        earlier, _unused = split_load_modes(earlier)
        earlier = repeats.summarise(earlier)
        comparison, comparison_note = compare.compare_runs(levels, earlier)

    content = ReportContent(
        run_id=run.run_id,
        results_dir=results_dir,
        baseline=baseline,
        context=context,
        levels=levels,
        planned_levels=run.planned_levels,
        crossovers=crossovers,
        speedup=speedup,
        recommendation=recommendation,
        notes=_notes(levels, baseline) + ([gpu_note] if gpu_note else []),
        request_errors=run.request_errors,
        comparison=comparison,
        comparison_note=comparison_note,
        compare_to=compare_to,
        warnings=warnings,
        rate_levels=run.rate_levels,
        derived=derived,
    )
    if tune is not None:
        content.tune = tune
        content.sections += tune_section.sections(tune)
    content.sections += repeats.sections(content)
    content.sections += percentile_table.sections(content)
    # Too few repeats for their interval: said in the report's warnings and by the CLI.
    few = repeats.repeats_warning(content)
    if few:
        warnings.append(few)
    fleet_view = fleet.fleet_view(levels, run.manifest, baseline)
    content.sections += fleet.fleet_sections(fleet_view)

    if with_plots:
        badge = figure_data.time_scale_badge(context.records, measured)
        chosen = figure_data.cdf_levels_for(levels, crossovers, cdf_levels)
        # The drawn levels' samples go to files (per token for ITL: bounded memory), read
        # back for the curves, then removed.
        with tempfile.TemporaryDirectory(prefix="servelab-report-") as spill:
            samples, more = distributions.read_samples(
                run.records.request_files if run.records is not None else [],
                distributions.wanted_levels(levels, chosen), spill)
            series = distributions.cdf_series(levels, chosen, samples)
        warnings += more
        figures = {
            "throughput.png": plots.plot_throughput(levels, baseline, crossovers, badge),
            "latency.png": plots.plot_latency(levels, baseline, badge),
            "speedup.png": plots.plot_speedup(speedup, baseline, levels, crossovers, badge),
            "comparison.png": plots.plot_comparison(
                comparison, os.path.basename(os.path.realpath(compare_to)), levels, badge
            )
            if compare_to
            else None,
            "pareto.png": plots.plot_pareto(levels, baseline,
                                            figure_data.gpu_counts(run.manifest), badge),
            "ttft_cdf.png": plots.plot_cdf(series, "ttft", chosen, baseline, badge),
            "itl_cdf.png": plots.plot_cdf(series, "itl", chosen, baseline, badge),
            "rate.png": plots.plot_rate(run.rate_levels, baseline, badge),
            "gpu.png": plots.plot_gpu(levels, baseline, badge),
            "derived.png": schedule_plot.plot_derived(derived, badge),
            fleet.FLEET_PLOT: fleet.plot_fleet(fleet_view, badge),
            tune_section.PLOT: tune_section.plot(tune) if tune is not None else None,
        }
        content.plots = {name: png for name, png in figures.items() if png}

    files = {
        SUMMARY: summary_markdown(content).encode("utf-8"),
        REPORT_HTML: report_html(content).encode("utf-8"),
    }
    files.update({os.path.join(PLOTS_DIR, name): png for name, png in content.plots.items()})
    if run.records is not None:
        files.update(export.export_files(run.records.rows, run.records.request_files,
                                         run.manifest, run.run_id))
    table = to_markdown(level_table(content))
    return ReportResult(
        results_dir=os.path.abspath(results_dir),
        run_id=run.run_id,
        baseline=baseline,
        table=table,
        crossover=analysis.crossover_map(crossovers),
        crossover_details=[dataclasses.asdict(c) for c in crossovers],
        speedup=[dataclasses.asdict(p) for p in speedup],
        recommendation=recommendation,
        time_scale=context.time_scale_text,
        comparison=[dataclasses.asdict(p) for p in comparison],
        notes=content.notes,
        warnings=warnings,
        msg=crossover_summary(content) + "\n" + recommendation,
        files=files,
        telemetry=gpu_figures,
        derived=schedule.derived_result(derived),
        repeats=[dataclasses.asdict(s) for s in repeats.spreads(content)],
        fleet=fleet_view.as_dict() if fleet_view is not None else None,
    )


def _levels_csv_with_telemetry(report: ReportResult, check_mode: bool) -> list:
    """levels.csv with the GPU telemetry columns filled, rebuilt from the parts under the run's
    lock (llm_bench's rebuild takes the same lock; a level llm_bench adds later rebuilds the file
    without them until the next report). Only for runs with parts and with telemetry."""
    if not any(f.get("gpu_samples") for f in report.telemetry.values()):
        return []
    parts_dir = os.path.join(report.results_dir, PARTS_DIR)
    if not os.path.isdir(parts_dir):
        return []
    path = os.path.join(report.results_dir, LEVELS)
    try:
        with run_lock(report.results_dir, timeout=30.0):
            rows = [row for row, _jsonl in read_parts(parts_dir)]
            for row in rows:
                row.update(report.telemetry.get(part_stem(row), {}))
            return [LEVELS] if write_if_changed(path, levels_csv(rows).encode("utf-8"), check_mode) else []
    except (ManifestError, PartError, OSError) as exc:
        report.warnings.append(f"{LEVELS} not rewritten with the GPU telemetry columns ({exc}); "
                               "they are in levels.json and levels.parquet")
        return []


def write_report(report: ReportResult, check_mode: bool = False) -> list:
    """Write the files whose bytes differ from what is there; return the changed relative paths.

    Plots the report no longer draws (e.g. speedup.png after the baseline went away) are removed,
    so plots/ never shows a figure from an earlier report of the same run.
    """
    changed = []
    for rel, data in sorted(report.files.items()):
        if write_if_changed(os.path.join(report.results_dir, rel), data, check_mode):
            changed.append(rel)
    for name in PLOT_FILES:
        rel = os.path.join(PLOTS_DIR, name)
        path = os.path.join(report.results_dir, rel)
        if rel not in report.files and os.path.isfile(path):
            changed.append(rel)
            if not check_mode:
                os.unlink(path)
    changed += _levels_csv_with_telemetry(report, check_mode)
    return changed
