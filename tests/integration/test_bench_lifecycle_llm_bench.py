"""llm_bench's action and a level that is already measured (the run lifecycle's resume rule),
through real ansible-playbook runs against the simulator: without the run's word in the manifest
a finished level is refused, never overwritten; `finished_levels: keep` keeps it byte for byte
and measures only the rest; `remeasure` measures it again."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import merge_into_manifest
from simproc import ServerProcess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def sweep(tmp_path, url, levels):
    path = tmp_path / "pb.yml"
    path.write_text(textwrap.dedent("""\
        - hosts: localhost
          gather_facts: false
          tasks:
            - name: "servelab: sweep"
              servelab.serving.llm_bench:
                base_url: "{url}"
                model: m
                profile: baseline
                run_id: run1
                results_root: "{root}"
                concurrency: {levels}
                max_tokens: 8
                level_seconds: 0.5
                server_metrics: false
        """).format(url=url, root=tmp_path / "results", levels=json.dumps(levels)))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=%s" % sys.executable, str(path)],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=300, check=False)


def test_a_measured_level_is_refused_kept_or_remeasured_as_the_run_says(tmp_path):
    run_dir = tmp_path / "results" / "run1"
    part = run_dir / "parts" / "localhost__baseline__c1.json"
    with ServerProcess("--profile", "fixed", "--ttft-ms", "5", "--step-ms", "1") as srv:
        first = sweep(tmp_path, srv.url, [1])
        assert first.returncode == 0, first.stdout[-3000:]
        measured = part.read_bytes()

        refused = sweep(tmp_path, srv.url, [1, 2])
        assert refused.returncode != 0
        assert "already measured in run run1" in refused.stdout, refused.stdout[-3000:]
        assert "bench_resume=run1" in refused.stdout
        assert part.read_bytes() == measured
        assert not (run_dir / "parts" / "localhost__baseline__c2.json").exists()

        merge_into_manifest(str(run_dir), {"finished_levels": "keep"})
        kept = sweep(tmp_path, srv.url, [1, 2])
        assert kept.returncode == 0, kept.stdout[-3000:]
        assert "C=1: measured earlier in this run, kept" in kept.stdout
        assert part.read_bytes() == measured
        assert (run_dir / "parts" / "localhost__baseline__c2.json").is_file()
        assert not (run_dir / "in_flight").exists()

        merge_into_manifest(str(run_dir), {"finished_levels": "remeasure"})
        again = sweep(tmp_path, srv.url, [1])
        assert again.returncode == 0, again.stdout[-3000:]
        assert "measuring it again (remeasure)" in again.stdout
        assert part.read_bytes() != measured
