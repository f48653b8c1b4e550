"""GPU telemetry joined to the levels (plugin_utils/report/telemetry.py, report/build.py): the
figures of the samples inside each window, energy by the trapezoid, tokens per joule, samples
outside the window ignored; the no-telemetry path (empty columns, one note); the exports,
plots/gpu.png and levels.csv carrying the columns."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LEVELS, PARTS_DIR,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    row_dict,
    FIELD, LevelRow,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    read_levels_csv, rebuild_run_files, write_level_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report import telemetry as rt
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import (
    build_report, write_report,
)

S = 1_000_000_000
T0 = 1_800_000_000 * S        # a wall-clock time, ns


def gpu(index, util, mem, power, clock=1800.0):
    return {"index": index, "sm_util_pct": util, "mem_used_mib": mem, "power_w": power,
            "sm_clock_mhz": clock}


def host_samples(points):
    return rt.HostSamples([t for t, _g in points], [g for _t, g in points])


def test_the_figures_of_the_samples_inside_the_window():
    samples = host_samples([
        (T0 - S, [gpu(0, 5, 10, 50), gpu(1, 5, 10, 50)]),          # before: ignored
        (T0 + 1 * S, [gpu(0, 80, 1000, 300), gpu(1, 60, 2000, 100, 1600.0)]),
        (T0 + 2 * S, [gpu(0, 100, 1500, 500), gpu(1, 40, 2000, 300, 1600.0)]),
        (T0 + 5 * S, [gpu(0, 0, 99999, 9999), gpu(1, 0, 99999, 9999)]),   # after: ignored
    ])
    # window [T0, T0 + 3 s]: samples at +1 s (400 W) and +2 s (800 W)
    figures = rt.summarise(samples, T0, T0 + 3 * S, output_tokens=1200.0)
    assert figures["gpu_samples"] == 2
    assert figures["gpu_sm_util_mean"] == pytest.approx((80 + 60 + 100 + 40) / 4)
    assert figures["gpu_mem_used_mib_max"] == 3500
    assert figures["gpu_power_w_mean"] == pytest.approx(600.0)
    assert figures["gpu_sm_clock_mhz_mean"] == pytest.approx((1800 + 1600) / 2)
    # 400 W held for the first second, trapezoid (400+800)/2 over 1 s, 800 W held for the last
    assert figures["gpu_energy_j"] == pytest.approx(400 + 600 + 800)
    assert figures["tokens_per_joule"] == pytest.approx(1200 / 1800)


def test_energy_needs_two_samples_and_power_from_every_gpu():
    one = host_samples([(T0 + S, [gpu(0, 50, 1, 300)])])
    figures = rt.summarise(one, T0, T0 + 2 * S, output_tokens=100.0)
    assert figures["gpu_power_w_mean"] == 300 and figures["gpu_energy_j"] is None
    assert figures["tokens_per_joule"] is None and figures["gpu_samples"] == 1
    partial = host_samples([(T0 + S, [gpu(0, 50, 1, 300), gpu(1, 50, 1, None)]),
                            (T0 + 2 * S, [gpu(0, 50, 1, 300), gpu(1, 50, 1, None)])])
    figures = rt.summarise(partial, T0, T0 + 3 * S, output_tokens=100.0)
    assert figures["gpu_power_w_mean"] is None and figures["gpu_energy_j"] is None
    assert figures["gpu_sm_util_mean"] == 50 and figures["tokens_per_joule"] is None


def test_no_sample_in_the_window_gives_empty_figures_and_a_zero_count():
    samples = host_samples([(T0 - S, [gpu(0, 50, 1, 300)])])
    figures = rt.summarise(samples, T0, T0 + S)
    assert figures["gpu_samples"] == 0
    assert all(figures[c] is None for c in rt.COLUMNS if c != "gpu_samples")


def test_every_column_is_defined_once_in_the_field_table():
    for name in rt.COLUMNS + ("window_start_unix_ns", "window_end_unix_ns"):
        f = FIELD[name]
        assert f.optional and f.meaning and not f.server
    assert FIELD["gpu_energy_j"].unit == "J" and FIELD["tokens_per_joule"].unit == "tok/J"
    assert FIELD["gpu_samples"].kind == "int" and FIELD["gpu_power_w_mean"].kind == "float"


# ---------------------------------------------------------------------------------------------
# A run directory


def level(profile, c, tok_s, start_ns, host="gpu1", window_s=4.0):
    values = dict(
        host=host, profile=profile, concurrency=c, requests=40, errors=0, window_s=window_s,
        output_tok_s=tok_s, output_tok_s_ci95=tok_s / 40, total_tok_s=tok_s * 2,
        request_s=c / 3.0, ttft_p50_ms=25.0, ttft_p90_ms=None, ttft_p99_ms=60.0,
        tpot_p50_ms=11.0, tpot_p90_ms=None, tpot_p99_ms=14.0, itl_p50_ms=10.0,
        itl_p99_ms=30.0, e2e_p50_ms=1000.0, e2e_p99_ms=1500.0, goodput_request_s=None,
        client_limited=False,
        window_start_unix_ns=start_ns, window_end_unix_ns=start_ns + int(window_s * S))
    return row_dict(LevelRow(**values))


def make_run(tmp_path, telemetry_lines=None):
    run = tmp_path / "run1"
    parts = run / PARTS_DIR
    for i, (profile, c) in enumerate([("baseline", 1), ("baseline", 4), ("eagle3", 1),
                                      ("eagle3", 4)]):
        write_level_files(str(parts), level(profile, c, 100.0 * (i + 1), T0 + i * 10 * S), [])
    rebuild_run_files(str(run))
    if telemetry_lines is not None:
        (run / rt.TELEMETRY_DIR).mkdir()
        for name, lines in telemetry_lines.items():
            (run / rt.TELEMETRY_DIR / name).write_text(
                "".join(json.dumps(line) + "\n" for line in lines))
    return str(run)


def sampled(host="gpu1", power=500.0):
    """Two GPUs sampled every 0.5 s over the whole run, one file per profile."""
    files = {}
    for name, first, last in (("baseline", 0, 20), ("eagle3", 20, 40)):
        lines = [{"kind": "start", "host_label": host, "profile": name, "t_ns": T0, "gpus": 2}]
        for k in range(first * 2, last * 2):
            t = T0 + k * S // 2
            lines.append({"kind": "sample", "t_ns": t,
                          "gpus": [gpu(0, 90, 1000, power), gpu(1, 70, 1000, power)]})
        lines.append({"kind": "end", "reason": "stopped"})
        files[f"{host}__{name}__{T0}.jsonl"] = lines
    files[f"{host}__eagle3__{T0}.jsonl"].append("torn {")  # a torn line is skipped
    return files


def test_the_report_joins_the_samples_to_every_level(tmp_path):
    run = make_run(tmp_path, sampled())
    report = build_report(run)
    assert not any("GPU telemetry" in n for n in report.notes)
    document = json.loads(report.files["levels.json"])
    by_key = {(r["profile"], r["concurrency"]): r for r in document["levels"]}
    first = by_key[("baseline", 1)]
    assert first["gpu_samples"] == 9          # a 4 s window, samples every 0.5 s, both ends
    assert first["gpu_sm_util_mean"] == pytest.approx(80)
    assert first["gpu_power_w_mean"] == pytest.approx(1000)
    assert first["gpu_energy_j"] == pytest.approx(4000)
    assert first["tokens_per_joule"] == pytest.approx(100.0 * 4 / 4000)
    assert by_key[("eagle3", 4)]["tokens_per_joule"] == pytest.approx(400.0 * 4 / 4000)
    assert {c["name"]: c.get("unit") for c in document["columns"]}["gpu_energy_j"] == "J"
    assert "plots/gpu.png" in report.files
    # levels.csv carries the columns once the report is written (under the run's lock)
    changed = write_report(report)
    assert LEVELS in changed
    rows = {(r["profile"], r["concurrency"]): r for r in read_levels_csv(os.path.join(run, LEVELS))}
    assert rows[("baseline", 1)]["gpu_samples"] == 9
    assert rows[("eagle3", 1)]["gpu_power_w_mean"] == pytest.approx(1000)
    # a second report of the same run writes nothing new
    assert write_report(build_report(run)) == []


def test_check_mode_leaves_levels_csv_alone(tmp_path):
    run = make_run(tmp_path, sampled())
    before = open(os.path.join(run, LEVELS)).read()
    assert LEVELS in write_report(build_report(run), check_mode=True)
    assert open(os.path.join(run, LEVELS)).read() == before


def test_no_telemetry_files_empty_columns_and_one_note(tmp_path):
    run = make_run(tmp_path)
    report = build_report(run)
    notes = [n for n in report.notes if "GPU telemetry" in n]
    assert len(notes) == 1 and notes[0].startswith("no GPU telemetry: none recorded")
    document = json.loads(report.files["levels.json"])
    assert all(r["gpu_samples"] is None and r["tokens_per_joule"] is None
               for r in document["levels"])
    assert "plots/gpu.png" not in report.files
    assert LEVELS not in write_report(report)
    assert "no GPU telemetry" in report.files["summary.md"].decode()


def test_no_nvml_on_the_server_is_the_note_with_its_reason(tmp_path):
    line = {"kind": "unavailable", "host_label": "gpu1", "t_ns": T0,
            "reason": "pynvml (nvidia-ml-py) not importable by /usr/bin/python3"}
    run = make_run(tmp_path, {f"gpu1__baseline__{T0}.jsonl": [line],
                              f"gpu1__eagle3__{T0 + 1}.jsonl": [line]})
    report = build_report(run)
    notes = [n for n in report.notes if "GPU telemetry" in n]
    assert notes == ["no GPU telemetry: pynvml (nvidia-ml-py) not importable by /usr/bin/python3"]
    assert "plots/gpu.png" not in report.files


def test_levels_without_wall_clock_windows_get_no_figures(tmp_path):
    row = level("baseline", 1, 100.0, T0)
    row["window_start_unix_ns"] = row["window_end_unix_ns"] = None
    telemetry = rt.read_run_telemetry(make_run(tmp_path, sampled()))
    assert rt.level_figures(row, telemetry) == dict.fromkeys(rt.COLUMNS)
    assert "1 level(s) had no sample" in rt.note(telemetry, [row])


def test_another_hosts_samples_are_not_joined(tmp_path):
    telemetry = rt.read_run_telemetry(make_run(tmp_path, sampled(host="gpu2")))
    row = level("baseline", 1, 100.0, T0)
    assert rt.level_figures(row, telemetry)["gpu_samples"] is None
    assert rt.note(telemetry, [row]).startswith("no GPU telemetry: no samples recorded")
