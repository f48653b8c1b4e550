"""A run on the controller (plugins/plugin_utils/run_record.py): opening (a reused run id with
measured levels is refused, bench_resume continues one, bench_remeasure needs it), the run-id
lock, the level in flight, closing (status, level_in_flight, the profiles that did not finish),
and the interrupt cleanup's command line (plugins/plugin_utils/interrupt.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.results.parts import write_level_files
from ansible_collections.servelab.serving.plugins.module_utils.run import lock
from ansible_collections.servelab.serving.plugins.plugin_utils import interrupt, run_record
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import (
    merge_into_manifest, read_manifest,
)


def me():
    return lock.Controller.of_pid(os.getpid())


def measured_run(root, run_id="r1", levels=(1, 2)):
    run_dir = os.path.join(root, run_id)
    merge_into_manifest(run_dir, {"run_id": run_id, "started_at": "2026-01-01T00:00:00Z",
                                  "status": "interrupted"})
    for c in levels:
        write_level_files(os.path.join(run_dir, "parts"),
                          {"host": "gpu1", "profile": "baseline", "concurrency": c}, [])
    return run_dir


def test_a_new_run_takes_the_run_id_and_writes_nothing_into_its_directory(tmp_path):
    root = str(tmp_path)
    opened = run_record.open_run(root, "r1", me())
    assert not opened.resumed and opened.measured_levels == 0
    assert not os.path.exists(os.path.join(root, "r1"))
    assert lock.read_record(opened.lock_path).run_id == "r1"


def test_a_reused_run_id_with_measured_levels_is_refused_before_anything(tmp_path):
    root = str(tmp_path)
    measured_run(root)
    with pytest.raises(run_record.RunError, match=r"2 measured level.*bench_resume=r1"):
        run_record.open_run(root, "r1", me())
    assert not os.path.exists(os.path.join(root, lock.RUN_LOCK_DIR, "run-r1.json"))


def test_resume_keeps_the_earlier_start_and_lists_what_is_measured(tmp_path):
    root = str(tmp_path)
    measured_run(root)
    opened = run_record.open_run(root, "r1", me(), resume="r1", now="2026-01-02T00:00:00Z")
    assert opened.resumed and opened.finished_levels == run_record.KEEP
    assert opened.measured == {"gpu1": {"baseline": [1, 2]}}
    assert opened.started_at == "2026-01-01T00:00:00Z"
    assert opened.resumed_at == ["2026-01-02T00:00:00Z"]
    assert opened.previous_status == "interrupted"
    again = run_record.open_run(root, "r1", me(), resume="r1", remeasure=True)
    assert again.finished_levels == run_record.REMEASURE


@pytest.mark.parametrize("kwargs, match", [
    ({"resume": "nope"}, r"bench_resume=nope but bench_run_id=r9"),
    ({"remeasure": True}, r"bench_remeasure=true .* -e bench_resume="),
])
def test_resume_and_remeasure_mistakes_name_the_variable(tmp_path, kwargs, match):
    with pytest.raises(run_record.RunError, match=match):
        run_record.open_run(str(tmp_path), "r9", me(), **kwargs)


def test_resuming_a_run_that_does_not_exist_lists_the_newest(tmp_path):
    root = str(tmp_path)
    measured_run(root, "r1")
    with pytest.raises(run_record.RunError, match=r"no run r2 .*newest runs there: r1"):
        run_record.open_run(root, "r2", me(), resume="r2")


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "latest", "with space"])
def test_a_run_id_must_be_a_plain_name(tmp_path, bad):
    with pytest.raises(run_record.RunError, match="bench_run_id"):
        run_record.open_run(str(tmp_path), bad, me())


def test_a_run_id_held_by_a_live_run_is_refused_naming_it(tmp_path):
    root = str(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_record.open_run(root, "r1", lock.Controller.of_pid(other.pid))
        with pytest.raises(run_record.RunError, match=r"run r1 \(ansible-playbook pid %d" % other.pid):
            run_record.open_run(root, "r1", me())
    finally:
        other.kill()
        other.wait(10)
    # Its process gone, the record is stale: taken over, with a note.
    opened = run_record.open_run(root, "r1", me())
    assert opened.notes and "took over" in opened.notes[0]


def test_in_flight_then_close_interrupted_records_the_level_and_releases(tmp_path):
    root = str(tmp_path)
    run_dir = measured_run(root, levels=(1,))
    run_record.open_run(root, "r1", me(), resume="r1")
    run_record.mark_in_flight(run_dir, "gpu1", "baseline", "C=2", 2, "2026-01-02T00:00:01Z")
    closed = run_record.close_run(root, "r1", me(), "interrupted", now="T", reason="SIGINT")
    manifest = read_manifest(run_dir)
    assert manifest["status"] == "interrupted" and manifest["interrupted_at"] == "T"
    assert manifest["interrupt_reason"] == "SIGINT"
    assert manifest["level_in_flight"] == [{"host": "gpu1", "profile": "baseline", "level": "C=2",
                                            "concurrency": 2, "repeat": 1,
                                            "started_at": "2026-01-02T00:00:01Z"}]
    assert closed.released and not os.path.exists(closed.released[0])
    assert not os.path.exists(os.path.join(run_dir, run_record.IN_FLIGHT_DIR))
    assert closed.measured_levels == 1


def test_a_resumed_run_that_finishes_keeps_the_reports_finished_at_and_no_level_in_flight(
        tmp_path):
    root = str(tmp_path)
    run_dir = measured_run(root, levels=(1,))
    run_record.open_run(root, "r1", me(), resume="r1")
    merge_into_manifest(run_dir, {"level_in_flight": [{"host": "gpu1", "level": "C=2"}],
                                  "interrupt_reason": "SIGINT", "interrupted_at": "T0"})
    # bench.yml writes finished_at before the report (which states it), then closes the run.
    merge_into_manifest(run_dir, {"finished_at": "T1"})
    run_record.close_run(root, "r1", me(), "finished", now="T2")
    manifest = read_manifest(run_dir)
    assert manifest["status"] == "finished" and manifest["finished_at"] == "T1"
    assert manifest["level_in_flight"] == [] and manifest["interrupt_reason"] is None
    assert manifest["interrupted_at"] == "T0"            # the run's history stays


def test_a_finished_level_is_a_complete_part_a_torn_one_is_not(tmp_path):
    parts = tmp_path / "parts"
    key = {"host": "gpu1", "profile": "baseline", "concurrency": 5}
    assert run_record.measured_part(str(parts), key) is None
    write_level_files(str(parts), key, [])
    assert run_record.measured_part(str(parts), key).endswith("gpu1__baseline__c5.json")
    (parts / "gpu1__baseline__c5.json").write_text("{")
    assert run_record.measured_part(str(parts), key) is None


def test_failed_profiles_are_failures_and_unfinished_planned_ones(tmp_path):
    manifest = {
        "hosts": {"gpu1": {"bench": {"profiles": ["baseline", "eagle3", "v2"]}}},
        "profiles": {"baseline": {"gpu1": {"status": "finished"}},
                     "eagle3": {"gpu1": {"status": "failed", "error": "died",
                                         "failed_task": "sweep"}}},
    }
    out = run_record.failed_profiles(manifest)
    assert [(p["profile"], p["status"], p["error"]) for p in out] == [
        ("eagle3", "failed", "died"), ("v2", "missing", "never started")]


def test_a_gpu_server_that_recorded_nothing_is_named_among_the_failures():
    # gpu2 failed (or went unreachable) before its first profile; gpu1's own failure is its own.
    manifest = {
        "gpu_servers": ["gpu1", "gpu2"],
        "hosts": {"gpu1": {"bench": {"profiles": ["baseline"]}}},
        "profiles": {"baseline": {"gpu1": {"status": "finished"}}},
    }
    out = run_record.failed_profiles(manifest)
    assert [(p["host"], p["profile"], p["status"]) for p in out] == [("gpu2", "*", "missing")]
    assert "before its first profile" in out[0]["error"]
    manifest["hosts"]["gpu2"] = {"bench": {"profiles": ["baseline"]}}
    manifest["profiles"]["baseline"]["gpu2"] = {"status": "finished"}
    assert run_record.failed_profiles(manifest) == []


def test_the_policy_is_the_manifests_word(tmp_path):
    run_dir = str(tmp_path / "r1")
    assert run_record.finished_levels_policy(run_dir) is None
    merge_into_manifest(run_dir, {run_record.FINISHED_LEVELS_KEY: "keep"})
    assert run_record.finished_levels_policy(run_dir) == "keep"


def test_the_cleanup_replays_the_runs_options_and_its_identity_last():
    cliargs = {"inventory": ("inventory/local",), "extra_vars": ("@vars.yml", "bench_run_id=x"),
               "subset": "gpu1", "forks": 8, "verbosity": 2, "vault_password_files": ("/v",),
               "private_key_file": None, "become": True, "connection": "ssh",
               "remote_user": "bench"}
    run = interrupt.OpenRun(run_id="r1", results_root="/res", run_dir="/res/r1")
    cmd = interrupt.cleanup_command(cliargs, run, 4242, "interrupted", "SIGTERM",
                                    playbook="/c/bench_interrupted.yml",
                                    ansible_playbook="/bin/ansible-playbook",
                                    defaults={"connection": "ssh", "forks": 8, "subset": None})
    assert cmd[:3] == ["/bin/ansible-playbook", "--inventory", "inventory/local"]
    assert cmd[cmd.index("--limit") + 1] == "gpu1" and "--become" in cmd and "-vv" in cmd
    # Options left at their defaults are not replayed: the cleanup reads ansible.cfg itself.
    assert "--private-key" not in cmd and "--connection" not in cmd and "--forks" not in cmd
    assert cmd[cmd.index("--user") + 1] == "bench"
    extras = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--extra-vars"]
    assert extras[:2] == ["@vars.yml", "bench_run_id=x"]
    identity = json.loads(extras[-1])
    resume = identity.pop("bench_resume_command")
    assert identity == {
        "bench_run_id": "r1", "bench_results_root": "/res", "bench_lock_owner_pid": 4242,
        "bench_interrupt_status": "interrupted", "bench_interrupt_reason": "SIGTERM"}
    # the report's resume command: the run's own options, then bench_resume
    assert resume.startswith("ansible-playbook --inventory inventory/local ")
    assert resume.endswith(" -vv -e bench_resume=r1 bench.yml"), resume
    assert cmd[-1] == "/c/bench_interrupted.yml"
    assert os.path.isfile(interrupt.CLEANUP_PLAYBOOK)
    # ansible-playbook's own defaults, read from its parser.
    assert interrupt.cli_defaults().get("connection")


def test_the_resume_command_keeps_the_playbook_and_masks_an_inline_secret():
    cliargs = {"inventory": ("inventory/local",), "args": ("bench.yml",),
               "extra_vars": ("@vars.yml", "bench_api_key=sk-live-0123456789abcdef")}
    cmd = interrupt.resume_command(cliargs, "r1", defaults={})
    assert cmd.startswith("ansible-playbook --inventory inventory/local --extra-vars @vars.yml ")
    assert cmd.endswith("-e bench_resume=r1 bench.yml")
    assert "sk-live-0123456789abcdef" not in cmd
