"""bench.yml leaks no secret: not into a results file, not into the state dir, not to the screen.

The standard: "Secrets never reach a file, a report or Ansible output." A unique canary goes in
every place a benchmark hands a secret over:
  - a profile's env (HF_TOKEN),
  - bench_server_env (OPENAI_API_KEY, for every server),
  - extra_args [--api-key, ...] of a server that takes the flag (the simulator behind
    tests/data/simulator_api_key.py, through the command engine),
  - extra_args [--api-key, ...] of a simulator, which rejects the flag and quotes it in its
    error: a server that fails to start, so a failing task's output is printed,
  - bench_api_key (llm_bench's bearer token; the simulator ignores the header), which also goes
    to an external endpoint (a simulator the test started: engine external), in its readiness
    check (GET /v1/models, an Authorization header) and its sweep.
bench.yml runs on the embedded default (small settings), once at default verbosity and once at
-vvv. The canary must appear in no file under the results root, in no file under the state dir
but the engines' own logs (0600: the simulator's error quotes its argv, as SGLang's log quotes
its ServerArgs), and nowhere in the playbook's stdout or stderr. The secrets must still have
reached the servers: the keyed server's sweep measured, the broken one failed on the flag.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import uuid

import pytest
from simproc import ServerProcess  # tests/ (conftest.py puts it on sys.path)

from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results
from testports import free_port as _free_port  # tests/testports.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
WRAPPER = os.path.join(REPO, "tests", "data", "simulator_api_key.py")

pytestmark = pytest.mark.slow


def _files(directory):
    for root, _dirs, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                yield path


def _holding(directory, needle: bytes):
    out = []
    for path in _files(directory):
        with open(path, "rb") as fh:
            if needle in fh.read():
                out.append(path)
    return sorted(out)


def _run(tmp_path, tag, verbosity, external_url):
    root, state_dir = tmp_path / "results", tmp_path / "servers"
    time_scale = 10
    profiles = [
        {"name": "baseline",
         "simulator": {"profile": "baseline", "time_scale": time_scale},
         "env": {"HF_TOKEN": f"{tag}-profile-env"}},
        {"name": "keyed", "engine": "command",
         "command": ["{python}", WRAPPER, "--host", "{host}", "--port", "{port}",
                     "--model-name", "{model}", "--profile", "baseline",
                     "--time-scale", str(time_scale)],
         "extra_args": ["--api-key", f"{tag}-extra-arg"]},
        {"name": "broken",
         "simulator": {"profile": "baseline", "time_scale": time_scale},
         "extra_args": ["--api-key", f"{tag}-broken-arg"]},
        # an endpoint servelab did not start: the key goes to it as a bearer token
        {"name": "outside", "engine": "external", "base_url": external_url,
         "model": "servelab-sim"},
    ]
    extravars = {
        "bench_profiles": profiles,
        "bench_concurrency": [1],
        "bench_level_seconds": 2,
        "bench_warmup_requests": 1,
        "bench_server_port": _free_port(),
        "bench_state_dir": str(state_dir),
        "bench_server_ready_timeout": 60,
        "bench_workload": {"kind": "synthetic", "input_tokens": 64, "output_tokens": 32,
                           "count": 8},
        "bench_max_tokens": 32,
        "bench_server_env": {"OPENAI_API_KEY": f"{tag}-server-env"},
        "bench_api_key": f"{tag}-api-key",
        # the broken profile fails, on purpose: the run still ends with its report
        "bench_continue_on_profile_failure": True,
    }
    # Extra vars from a file, as secrets come from an inventory: never on a command line.
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(extravars))
    env = dict(os.environ,
               PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
               ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
               ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote-tmp"),
               ANSIBLE_NOCOLOR="1",
               SERVELAB_RESULTS_ROOT=str(root))
    done = subprocess.run(
        [os.path.join(VENV_BIN, "ansible-playbook"), "-e", f"@{extra}", *verbosity,
         os.path.join(REPO, "bench.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    return done, root, state_dir


@pytest.mark.parametrize("verbosity", [[], ["-vvv"]], ids=["default", "vvv"])
def test_no_secret_in_results_state_or_output(tmp_path, verbosity):
    tag = f"servelab-canary-{uuid.uuid4().hex}"
    with ServerProcess("--profile", "baseline", "--time-scale", "10") as outside:
        done, root, state_dir = _run(tmp_path, tag, verbosity, outside.url)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]

    # The run did what it should: the secrets reached the servers.
    run_dir = (root / results.LATEST_LINK).resolve()
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    status = {p: rec["localhost"]["status"] for p, rec in manifest["profiles"].items()}
    assert status == {"baseline": "finished", "keyed": "finished", "broken": "failed",
                      "outside": "finished"}, status
    assert manifest["profiles"]["outside"]["localhost"]["engine"] == "external"
    assert "--api-key" in manifest["profiles"]["keyed"]["localhost"]["cmdline"]
    assert manifest["profiles"]["baseline"]["localhost"]["env"]["HF_TOKEN"] == "<redacted>"
    # the failing task's output is on the screen, readable, with the secret masked
    assert "unrecognized arguments: --api-key" in output
    assert (run_dir / results.SUMMARY).is_file() and (run_dir / results.REPORT_HTML).is_file()

    needle = tag.encode()
    # Not on the screen, at this verbosity.
    at = output.find(tag)
    assert at < 0, output[max(0, at - 600):at + 200]
    # Not in any file of the results root (manifest, parts, levels.csv, requests, reports, plots).
    assert _holding(root, needle) == []
    # Not in the state dir, but for the engines' own logs, which are their owner's alone.
    for path in _holding(state_dir, needle):
        assert os.path.basename(path).startswith("server.log"), path
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    for path in _files(state_dir):
        if os.path.basename(path) == "state.json":
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    # Nor anything Ansible left behind (its module payloads carry the arguments).
    assert _holding(tmp_path / "ansible-tmp", needle) == []
    assert _holding(tmp_path / "ansible-remote-tmp", needle) == []
