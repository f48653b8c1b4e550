#!/usr/bin/python
# -*- coding: utf-8 -*-
# bench_report runs on the controller, as the action plugin plugins/action/bench_report.py. This file holds
# its documentation and its argument spec, which the action validates the task's arguments with
# (so ansible-doc, ansible-test's validate-modules and the action agree); main() only answers
# that the module is not meant to run on a host.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_report
short_description: Report one servelab benchmark run side by side (tables, plots, crossover)
description:
  - Runs on the controller (action plugin). Reads C(levels.csv) of one run, and
    C(manifest.json) and C(requests.jsonl) when present, with pandas.
  - Writes C(summary.md) (the side-by-side table per concurrency level, speedup against the
    baseline, the crossover concurrency, a recommendation), C(report.html) (self-contained, with
    inline CSS and the plots embedded as base64 PNG, no network) and C(plots/throughput.png),
    C(plots/latency.png), C(plots/speedup.png) (with the 95% CI band of the ratio and the
    crossover's bracket), C(plots/pareto.png) (output tok/s per GPU against tok/s per user,
    the Pareto frontier marked), C(plots/ttft_cdf.png) and C(plots/itl_cdf.png) (per-request
    distributions at the O(cdf_levels)), C(plots/comparison.png) (with O(compare_to)).
  - Every plot marks the excluded levels (an x, the reason in the legend); every plot of a
    time-scaled simulator run carries a badge with the factor and the real-time equivalent.
  - Writes the run's data for pandas and other tools beside them, typed from servelab's field
    table, C(levels.json) (with C(schema_version), valid against the C(levels.schema.json)
    written with it), C(levels.parquet) and C(requests.parquet). Every level row carries the
    run id, engine, engine version, model, simulator time scale and the host's GPU name and
    count; every request its phase, error kind and wall-clock send time. Error texts are redacted.
  - Joins the GPU telemetry samples under C(telemetry/) (the bench role's gpu_telemetry) to each
    level by its wall-clock window (SM utilisation, memory, power, SM clock, energy, tokens per
    joule) into those files and C(levels.csv), and draws C(plots/gpu.png); without samples it
    says why in one note.
  - Two output tok/s whose difference is within their two 95% half-widths together are a tie
    (C(~) in the tables), neither a win nor a loss. The crossover of a profile on a host is the
    first measured level at which its output tok/s falls below the baseline's beyond the
    half-widths after having been above it beyond them at a lower level; the recommendation
    names a profile over the baseline only where it wins beyond them. Levels where either
    profile failed, hit more errors than O(max_error_rate), or was C(client_limited) are marked in
    the tables and left out of the speedup conclusions, the crossover and the recommendation.
  - A level measured more than once (llm_bench's C(repeats), the bench role's C(bench_repeats))
    is one row in the tables, plots and conclusions, the mean of its usable repeats with the 95%
    half-width across them (t(n-1) x SD / sqrt(n), at least the repeats' own CI95s combined); a
    C(Repeats) table shows each level's SD, min, max, repeats counted and every repeat's output
    tok/s. The exports keep one row per repeat (column C(repeat)).
  - A run cut short (missing levels) is reported with what it has, missing levels marked. With a
    single profile, or without the baseline, the report says there is no speedup.
  - The simulator's C(time_scale) recorded in the manifest (C(profiles.<profile>.<host>.time_scale))
    is stated in the summary and the report.
  - Files are written atomically and only when their bytes change, so C(changed) means the report
    changed.
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  results_dir:
    description:
      - The run's directory, C(results/<run_id>) (or C(results/latest)). Relative paths are taken
        from the playbook's directory.
    type: path
    required: true
  baseline:
    description: Profile every other profile is compared with.
    type: str
    default: baseline
  compare_to:
    description:
      - An earlier run's directory; the report adds the per-level change of output tok/s, TTFT and
        TPOT against it (matched by host, profile and concurrency; two single-host runs with
        different host names are matched anyway, and the report says so).
    type: path
  plots:
    description: Draw the PNG plots (matplotlib, Agg). Without them the HTML has tables only.
    type: bool
    default: true
  max_error_rate:
    description:
      - Fraction of errored requests above which a level is excluded from the conclusions (it
        stays in the tables, marked).
    type: float
    default: 0.1
  cdf_levels:
    description:
      - Concurrency levels of the TTFT and ITL distribution plots (C(plots/ttft_cdf.png),
        C(plots/itl_cdf.png)), one panel per level and host. A level the run did not measure
        shows as such.
      - Default, per host, the lowest and the highest measured level and the bracket of every
        crossover.
      - The distributions are of the window requests that succeeded, from the request records.
        ITL is per token from the records' per-chunk arrival times (C(chunk_times)) where they
        hold them; llm_bench's records normally do not, and each request's TPOT then stands in
        for it. The axis says which.
    type: list
    elements: int
attributes:
  check_mode:
    support: full
    description: Computes everything and reports which files would change; writes nothing.
  action:
    support: full
    description: Runs on the controller only; the task's host is never contacted.
notes:
  - Needs pandas, numpy, matplotlib and pyarrow on the controller (the collection's
    requirements.txt - C(python3 -m pip install -r <collection>/requirements.txt)). The task
    fails naming what is missing and the install command.
"""

EXAMPLES = r"""
- name: "servelab: report"
  servelab.serving.bench_report:
    results_dir: "{{ playbook_dir }}/results/{{ bench_run_id }}"
    baseline: baseline
  register: report

- name: Compare with an earlier run
  servelab.serving.bench_report:
    results_dir: results/latest
    compare_to: results/20250101T000000Z-1234
"""

RETURN = r"""
table:
  description: The side-by-side level table (Markdown), the same as in summary.md.
  returned: success
  type: str
crossover:
  description:
    - "C({profile: {host: concurrency or null}}) for every profile but the baseline: the first
      measured level at which it falls below the baseline; null when it never crosses (it never
      won, never lost, or there is no baseline on that host)."
  returned: success
  type: dict
  sample: {"eagle3": {"ct129": 5}}
crossover_details:
  description:
    - One entry per (host, profile) with C(status) (crossed, never_won, always_wins, no_baseline,
      no_common_levels), C(concurrency), C(bracket) ([last level won, first level lost after
      it]), C(estimate) (piecewise-linear interpolation of the tok/s difference between the
      bracket's levels), C(won_at), C(lost_at), C(tied_at) (within the two 95% half-widths),
      C(excluded) levels and C(text).
  returned: success
  type: list
  elements: dict
speedup:
  description:
    - One entry per (host, profile, concurrency) of every profile but the baseline, with
      C(speedup) (output tok/s over the baseline's, null without a baseline level),
      C(profile_tok_s), C(baseline_tok_s), C(within_ci) (difference inside both 95% CIs, a tie),
      C(usable) (both levels usable) and C(note).
  returned: success
  type: list
  elements: dict
recommendation:
  description: One paragraph, which profile to serve at which concurrency, per host.
  returned: success
  type: str
time_scale:
  description: The sentence on the simulator's time scale stated in the report.
  returned: success
  type: str
repeats:
  description:
    - When some level was measured more than once, one entry per level with C(host), C(profile),
      C(level), C(repeats) (counted), C(repeats_measured), C(output_tok_s) (their mean),
      C(output_tok_s_ci95) (its 95% half-width), C(output_tok_s_sd), C(output_tok_s_min),
      C(output_tok_s_max) and C(by_repeat) (repeat -> output tok/s); empty otherwise.
  returned: success
  type: list
  elements: dict
comparison:
  description: Per-level changes against O(compare_to) (empty without it).
  returned: success
  type: list
  elements: dict
notes:
  description: Sentences such as "only one profile, no speedup".
  returned: success
  type: list
  elements: str
files:
  description: Absolute paths of summary.md, report.html and the plots.
  returned: success
  type: list
  elements: str
changed_files:
  description:
    - Files (relative to O(results_dir)) written or removed, or that would be in check mode.
  returned: success
  type: list
  elements: str
msg:
  description: The crossover lines and the recommendation, for display.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    results_dir=dict(type="path", required=True),
    baseline=dict(type="str", default="baseline"),
    compare_to=dict(type="path"),
    plots=dict(type="bool", default=True),
    max_error_rate=dict(type="float", default=0.1),
    cdf_levels=dict(type="list", elements="int"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="bench_report is an action plugin: it runs on the controller, never as a module "
                         "on a host (is servelab.serving's plugins/action/bench_report.py missing?)")


if __name__ == "__main__":
    main()
