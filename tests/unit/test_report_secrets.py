"""bench_manifest and bench_report write no secret, whatever reaches them (canary strings).

llm_server hands over its command line and env redacted already; these are the next lines of
defence: a merge that carries a secret anyway (a hand-written task, an older servelab, a log tail
quoting the engine's arguments) is redacted before manifest.json is written, and the report
redacts what it renders from a manifest it did not write.
"""
from __future__ import annotations

import json
import os
import stat
import uuid

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LEVEL_COLUMNS,
    LEVELS,
    MANIFEST,
    REPORT_HTML,
    REQUESTS,
    SUMMARY,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import merge_into_manifest
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import (
    build_report,
    write_report,
)

CANARY = f"servelab-canary-{uuid.uuid4().hex}"


def profile_record(tag):
    """A profile record as a careless writer could hand it over, a secret in every field."""
    return {
        "engine": "sglang",
        "status": "failed",
        "cmdline": f"python -m sglang.launch_server --api-key {CANARY}{tag}a --port 30000",
        "cmd": ["python", "-m", "sglang.launch_server", f"--hf-token={CANARY}{tag}b"],
        "env": {"HF_TOKEN": f"{CANARY}{tag}c", "CUDA_HOME": "/usr/local/cuda"},
        "error": f"server exited; server_args=ServerArgs(api_key='{CANARY}{tag}d')",
        "log_tail": (f"unrecognized arguments: --api-key {CANARY}{tag}a\n"
                     f"also seen: {CANARY}{tag}c"),
        "failed_task": "Start the server",
    }


def level_rows():
    rows = []
    for profile in ("baseline", "eagle3"):
        for c in (1, 2):
            row = dict.fromkeys(LEVEL_COLUMNS, "")
            row.update(host="h1", profile=profile, concurrency=c, requests=10, errors=0,
                       window_s=5, output_tok_s=100.0 * c, client_limited=False)
            rows.append(row)
    return rows


def files_under(directory):
    for root, _dirs, names in os.walk(directory):
        for name in names:
            yield os.path.join(root, name)


def test_manifest_merge_is_redacted_before_it_is_written(tmp_path):
    run_dir = tmp_path / "run"
    update = merge_into_manifest(str(run_dir), {"profiles": {"p": {"h1": profile_record("1")}}},
                                 record_git_from=None)
    text = (run_dir / MANIFEST).read_text()
    assert CANARY not in text
    assert CANARY not in json.dumps(update.manifest)        # what the task returns, too
    record = json.loads(text)["profiles"]["p"]["h1"]
    assert record["env"] == {"HF_TOKEN": "<redacted>", "CUDA_HOME": "/usr/local/cuda"}
    assert record["cmdline"].startswith("python -m sglang.launch_server --api-key ")
    # results stay readable by the team: they hold no secret
    assert stat.S_IMODE(os.stat(run_dir / MANIFEST).st_mode) == 0o644


def test_a_secret_already_in_the_manifest_is_cleaned_by_the_next_merge(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / MANIFEST).write_text(json.dumps({"profiles": {"p": {"h1": profile_record("2")}}}))
    merge_into_manifest(str(run_dir), {"finished_at": "2026-01-01T00:00:00"},
                        record_git_from=None)
    assert CANARY not in (run_dir / MANIFEST).read_text()


def test_check_mode_returns_a_redacted_manifest_too(tmp_path):
    update = merge_into_manifest(str(tmp_path / "absent"), {"p": profile_record("3")},
                                 record_git_from=None, check_mode=True)
    assert CANARY not in json.dumps(update.manifest)


def test_report_renders_no_secret_from_a_manifest_that_holds_them(tmp_path):
    import csv

    with open(tmp_path / LEVELS, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(LEVEL_COLUMNS))
        writer.writeheader()
        writer.writerows(level_rows())
    # written by hand (or by an older servelab): bench_manifest's redaction never saw it
    (tmp_path / MANIFEST).write_text(json.dumps({"profiles": {
        "baseline": {"h1": dict(profile_record("4"), status="finished")},
        "eagle3": {"h1": profile_record("5")}}}))
    with open(tmp_path / REQUESTS, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"host": "h1", "profile": "eagle3", "concurrency": 2,
                             "error": f"HTTP 401 Authorization: Bearer {CANARY}6 refused"}) + "\n")
    report = build_report(str(tmp_path), with_plots=False)
    write_report(report)
    for name in (SUMMARY, REPORT_HTML):
        text = (tmp_path / name).read_text()
        assert CANARY not in text, name
    html = (tmp_path / REPORT_HTML).read_text()
    # the command lines and failures are still there, readable
    assert "sglang.launch_server" in html and "HF_TOKEN=&lt;redacted&gt;" in html
    assert "Bearer &lt;redacted&gt;" in html
    assert CANARY not in json.dumps(report.as_result(), default=str)
    for path in files_under(tmp_path):
        with open(path, "rb") as fh:
            assert CANARY.encode() not in fh.read() or path.endswith((MANIFEST, REQUESTS)), path
