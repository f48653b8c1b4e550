"""llm_bench's `repeats` through a real ansible-playbook run against the simulator: every level
measured N times in rounds, each repeat its own part files and rows (`repeat`), the progress
line saying which repeat and counting them in the ETA; a resumed run keeps the finished repeats
and measures only the one that is missing. About 15 s (three short playbook runs)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap

from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import merge_into_manifest
from simproc import ServerProcess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def sweep(tmp_path, url, levels, repeats):
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
                repeats: {repeats}
                max_tokens: 8
                level_seconds: 0.3
                warmup_requests: 0
                min_latency_samples: 0
                server_metrics: false
        """).format(url=url, root=tmp_path / "results", levels=json.dumps(levels),
                    repeats=repeats))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=%s" % sys.executable, str(path)],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=300, check=False)


def test_repeats_run_in_rounds_and_a_resume_measures_only_the_missing_repeat(tmp_path):
    parts = tmp_path / "results" / "run1" / results.PARTS_DIR
    names = {1: "localhost__baseline__c1", 2: "localhost__baseline__c1__rep2",
             3: "localhost__baseline__c1__rep3"}
    with ServerProcess("--profile", "fixed", "--ttft-ms", "5", "--step-ms", "1") as srv:
        first = sweep(tmp_path, srv.url, [1, 2], 3)
        assert first.returncode == 0, first.stdout[-3000:]
        out = first.stdout
        # Rounds: every level once, then every level again; the line names the repeat.
        order = [out.index("level %d/2 C=%d · repeat %d/3" % (level, level, repeat))
                 for repeat in (1, 2, 3) for level in (1, 2)]
        assert order == sorted(order), out[-3000:]
        # Six measurements: the ETA before the last one counts one left, before the first six.
        assert "C=2 · repeat 3/3" in out and "ETA ~" in out
        for repeat, stem in names.items():
            row = json.loads((parts / (stem + ".json")).read_text())["level"]
            assert row["repeat"] == repeat and row["concurrency"] == 1
            records = [json.loads(line) for line in (parts / (stem + ".jsonl")).open()]
            assert records and {r["repeat"] for r in records} == {repeat}
        with open(tmp_path / "results" / "run1" / results.LEVELS, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert sorted((int(r["concurrency"]), int(r["repeat"])) for r in rows) == [
            (c, r) for c in (1, 2) for r in (1, 2, 3)]

        # Repeat 2 of C=1 lost (a part file deleted): the resumed run measures it and only it.
        kept = {r: (parts / (names[r] + ".json")).read_bytes() for r in (1, 3)}
        for suffix in (".json", ".jsonl"):
            (parts / (names[2] + suffix)).unlink()
        merge_into_manifest(str(tmp_path / "results" / "run1"), {"finished_levels": "keep"})
        resumed = sweep(tmp_path, srv.url, [1, 2], 3)
        assert resumed.returncode == 0, resumed.stdout[-3000:]
        out = resumed.stdout
        assert out.count(": running (window") == 1, out[-3000:]
        assert "baseline C=1 repeat 2/3: running" in out
        assert out.count("measured earlier in this run, kept") == 5
        assert "1 level(s) written" in out and "5 kept from earlier in the run" in out
        for repeat in (1, 3):
            assert (parts / (names[repeat] + ".json")).read_bytes() == kept[repeat]
        assert json.loads((parts / (names[2] + ".json")).read_text())["level"]["repeat"] == 2


def test_repeats_below_one_are_refused_before_any_level(tmp_path):
    with ServerProcess("--profile", "fixed", "--ttft-ms", "5", "--step-ms", "1") as srv:
        refused = sweep(tmp_path, srv.url, [1], 0)
    assert refused.returncode != 0
    assert "llm_bench: repeats: 0 must be an integer >= 1" in refused.stdout, refused.stdout[-2000:]
    assert not (tmp_path / "results" / "run1" / results.PARTS_DIR).exists()
