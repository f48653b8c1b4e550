"""bench_manifest, bench_report and the servelab callback through a real ansible-playbook run.

One playbook run (module-scoped: ansible-playbook start-up is slow on a shared machine) with the
repo's ansible.cfg: several hosts merge into one manifest in parallel forks, the latest link is
made, a synthetic run is reported (twice: the second must change nothing), a run without
levels.csv fails clearly, check mode writes nothing, and the callback prints the summary.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVEL_COLUMNS  # noqa: E402

LEVELS = [1, 2, 4, 8, 16]
HOSTS = [f"w{i}" for i in range(6)]
MERGES_PER_HOST = 4
TIME_SCALE = 12


def baseline_tps(c):
    return 95.0 * c


def spec_tps(c):
    return 210.0 + 45.0 * c


def write_levels(run_dir):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "levels.csv"), "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=LEVEL_COLUMNS)
        writer.writeheader()
        for profile, tps in (("baseline", baseline_tps), ("eagle3", spec_tps)):
            for c in LEVELS:
                row = {col: 1.0 for col in LEVEL_COLUMNS}
                row.update(
                    host="localhost",
                    profile=profile,
                    concurrency=c,
                    requests=50,
                    errors=0,
                    output_tok_s=tps(c),
                    output_tok_s_ci95=tps(c) / 100,
                    client_limited=False,
                )
                writer.writerow(row)


PLAYBOOK = textwrap.dedent("""\
    - name: Every host records its part at once (parallel forks)
      hosts: workers
      gather_facts: false
      tasks:
        - name: "servelab: record {{ inventory_hostname }}"
          servelab.serving.bench_manifest:
            results_dir: "{{ run_dir }}"
            merge:
              hosts: "{{ {inventory_hostname: {'k' ~ item: item}} }}"
          loop: "{{ range(merges) | list }}"

    - name: Controller side
      hosts: localhost
      gather_facts: false
      tasks:
        - name: Record the time scale and point latest at the run
          servelab.serving.bench_manifest:
            results_dir: "{{ run_dir }}"
            create_latest_link: true
            merge:
              profiles:
                baseline: {localhost: {engine: simulator, time_scale: "{{ time_scale }}"}}
                eagle3: {localhost: {engine: simulator, time_scale: "{{ time_scale }}"}}

        - name: "servelab: report"
          servelab.serving.bench_report:
            results_dir: "{{ run_dir }}"
          register: first

        - name: Report again (nothing may change)
          servelab.serving.bench_report:
            results_dir: "{{ run_dir }}"
          register: second

        - name: A report that fails, rescued (as the bench role rescues a failed profile)
          block:
            - name: "servelab: report a directory without levels.csv"
              servelab.serving.bench_report:
                results_dir: "{{ empty_dir }}"
              register: missing
          rescue:
            - name: Go on after the failure
              ansible.builtin.set_fact:
                rescued: true

        - name: Report in check mode
          servelab.serving.bench_report:
            results_dir: "{{ check_dir }}"
          check_mode: true
          register: checked

        - name: Save what the tasks returned
          ansible.builtin.copy:
            dest: "{{ out_file }}"
            content: "{{ {'first': first, 'second': second, 'missing': missing,
                          'checked': checked} | to_nice_json }}"
            mode: "0644"
    """)


@pytest.fixture(scope="module")
def play(tmp_path_factory):
    work = tmp_path_factory.mktemp("bench_report_play")
    results = work / "results"
    run_dir = results / "run-1"
    write_levels(str(run_dir))
    write_levels(str(work / "check"))
    (work / "empty").mkdir()
    (work / "site.yml").write_text(PLAYBOOK)
    (work / "hosts.ini").write_text(
        "[workers]\n" + "\n".join(HOSTS) + "\n\n[all:vars]\nansible_connection=local\n"
        "ansible_python_interpreter=" + sys.executable + "\n\n[local]\nlocalhost\n"
    )
    extra = {
        "run_dir": str(run_dir),
        "empty_dir": str(work / "empty"),
        "check_dir": str(work / "check"),
        "out_file": str(work / "out.json"),
        "merges": MERGES_PER_HOST,
        "time_scale": TIME_SCALE,
    }
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
        PATH=os.path.join(REPO, ".venv", "bin") + os.pathsep + os.environ.get("PATH", ""),
        ANSIBLE_CALLBACKS_ENABLED="servelab.serving.progress",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(work / "hosts.ini"), "-e", json.dumps(extra), "site.yml"],
        cwd=str(work),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    returned = json.loads((work / "out.json").read_text())
    return {"proc": proc, "results": results, "run_dir": run_dir, "work": work, "out": returned}


def test_parallel_forks_lose_no_manifest_part(play):
    manifest = json.loads((play["run_dir"] / "manifest.json").read_text())
    assert manifest["hosts"] == {h: {f"k{i}": i for i in range(MERGES_PER_HOST)} for h in HOSTS}
    assert "git" in manifest  # recorded once: a commit, or null with the reason


def test_latest_link_points_at_the_run(play):
    link = play["results"] / "latest"
    assert os.readlink(link) == "run-1"


def test_report_returns_the_formulas_crossover(play):
    first = play["out"]["first"]
    first_below = next(c for c in LEVELS if spec_tps(c) < baseline_tps(c))
    assert first["changed"] is True
    assert first["crossover"] == {"eagle3": {"localhost": first_below}}
    [detail] = first["crossover_details"]
    assert detail["estimate"] == pytest.approx(210.0 / (95.0 - 45.0))
    assert f"time_scale {TIME_SCALE}" in first["time_scale"]
    for path in first["files"]:
        assert os.path.isfile(path)
    assert "| eagle3 |" in first["table"]


def test_second_report_changes_nothing(play):
    assert play["out"]["second"]["changed"] is False
    assert play["out"]["second"]["changed_files"] == []


def test_missing_levels_csv_fails_clearly(play):
    missing = play["out"]["missing"]
    assert missing["failed"] is True
    assert "no levels.csv in" in missing["msg"] and str(play["work"] / "empty") in missing["msg"]


def test_check_mode_writes_nothing(play):
    checked = play["out"]["checked"]
    assert checked["changed"] is True and "summary.md" in checked["changed_files"]
    assert sorted(os.listdir(play["work"] / "check")) == ["levels.csv"]


def test_callback_prints_progress_and_summary(play):
    out = play["proc"].stdout
    assert "servelab | localhost | servelab: report | changed" in out
    assert "servelab | w0 | servelab: record w0 | started" in out
    summary = out.split("servelab summary", 1)[1]
    assert "| eagle3 |" in summary and "crossover: eagle3@localhost" in summary
    assert str(play["run_dir"] / "summary.md") in summary
    # The failing report task is listed among the failures, and each run's table printed once.
    assert "servelab tasks that failed" in summary and "no levels.csv" in summary
    assert summary.count(f"report of run-1 ({play['run_dir']})") == 1
