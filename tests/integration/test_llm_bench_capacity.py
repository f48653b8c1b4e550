"""llm_bench's capacity search through a real ansible-playbook run against the simulator: the
levels follow one another by bisection (short, then full), the outcome file names the bracket and
the score, no load is measured twice, a resumed sweep keeps its levels and measures nothing
again, and a bad search is refused before any level. About 40 s on 2 cores."""
from __future__ import annotations

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
# A server of 4 running slots, each request 8 steps of 20 ms: 4 / 0.16 s = 25 requests/s at
# most; above that the queue (and the TTFT) grows without bound.
SERVER = ("--profile", "baseline", "--step-base-ms", "20", "--step-per-req-ms", "0",
          "--moe-ms", "0", "--prefill-per-token-ms", "0", "--request-overhead-ms", "0",
          "--max-running", "4")
SEARCH = {"axis": "rate", "objective": {"metric": "goodput", "slo": {"ttft_ms": 150},
                                        "percentile": 90},
          "start": 6, "short_seconds": 1.0, "full_seconds": 2.0, "tolerance": 0.12,
          "short_tolerance": 0.4, "minimum": 0.5, "maximum": 200, "max_levels": 12}


def sweep(tmp_path, url, search):
    path = tmp_path / "pb.yml"
    path.write_text(textwrap.dedent("""\
        - hosts: localhost
          gather_facts: false
          tasks:
            - name: "servelab: sweep"
              servelab.serving.llm_bench:
                base_url: "{url}"
                model: m
                profile: trial
                run_id: run1
                results_root: "{root}"
                concurrency: [64]
                capacity_search: {search}
                max_tokens: 8
                workload: {{kind: synthetic, input_tokens: 16, output_tokens: 8, count: 64}}
                warmup_requests: 0
                min_latency_samples: 10
                server_metrics: false
                drain_timeout: 5
        """).format(url=url, root=tmp_path / "results", search=json.dumps(search)))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=%s" % sys.executable, str(path)],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=400, check=False)


def test_capacity_search_bisects_and_a_resume_keeps_its_levels(tmp_path):
    run_dir = tmp_path / "results" / "run1"
    with ServerProcess(*SERVER) as srv:
        first = sweep(tmp_path, srv.url, SEARCH)
        assert first.returncode == 0, first.stdout[-4000:]
        outcome = json.loads((run_dir / results.CAPACITY_DIR / "localhost__trial.json").read_text())
        assert outcome["status"] == "found", outcome
        # 25 requests/s is the most the server can finish; the SLO is missed a little below it.
        assert 6 <= outcome["lo"] < outcome["hi"] <= 30, outcome
        assert outcome["score"] is not None and outcome["score"] <= outcome["best_x"] * 1.3
        xs = [m["x"] for m in outcome["levels_measured"]]
        assert len(xs) == len(set(xs)) == outcome["levels"] <= 12
        phases = [m["phase"] for m in outcome["levels_measured"]]
        assert phases[0] == "short" and phases[-1] == "full"
        assert "capacity search, short level (1s)" in first.stdout
        parts = sorted(p.name for p in (run_dir / results.PARTS_DIR).glob("*.json"))
        assert len(parts) == len(xs), parts
        rates = sorted(json.loads((run_dir / results.PARTS_DIR / p).read_text())["level"]
                       ["request_rate"] for p in parts)
        assert rates == sorted(xs)

        merge_into_manifest(str(run_dir), {"finished_levels": "keep"})
        again = sweep(tmp_path, srv.url, SEARCH)
    assert again.returncode == 0, again.stdout[-3000:]
    assert ": running (window" not in again.stdout
    assert again.stdout.count("measured earlier in this run, kept") == len(xs)
    replayed = json.loads((run_dir / results.CAPACITY_DIR / "localhost__trial.json").read_text())
    assert (replayed["lo"], replayed["hi"], replayed["score"]) == (
        outcome["lo"], outcome["hi"], outcome["score"])


def test_a_bad_capacity_search_is_refused_before_any_level(tmp_path):
    with ServerProcess(*SERVER) as srv:
        refused = sweep(tmp_path, srv.url, dict(SEARCH, short_seconds=5))
    assert refused.returncode != 0
    assert "short_seconds 5 must be below full_seconds 2" in refused.stdout, refused.stdout[-2000:]
    assert not (tmp_path / "results" / "run1" / results.PARTS_DIR).exists()
