"""The Python API and the `servelab` command (tools/servelab/): bench.yml through ansible-runner,
its error path, the report rebuilt without Ansible, and the wheel `pip install .` builds.

The bench run is the slow one (~1 minute): it runs once per module (bench_run below) and the report
tests work on copies of its results directory.
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import servelab   # tools/servelab (conftest.py puts tools/ on sys.path)
from servelab import _build, _paths
from testports import free_port as _free_port  # tests/testports.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(REPO, "tools")
LEVELS = [1, 5]
TIME_SCALE = 10
SECRET = "sk-servelab-canary-4e1f"


def _bench_vars(tmp_path) -> dict:
    """test_bench_playbook.py's settings: 2 profiles, 2 short levels."""
    return {
        "bench_profiles": [
            {"name": "baseline", "simulator": {"profile": "baseline", "time_scale": TIME_SCALE}},
            {"name": "eagle3", "simulator": {"profile": "eagle3", "spec_accept_rate": 0.8,
                                             "time_scale": TIME_SCALE}},
        ],
        "bench_concurrency": LEVELS,
        "bench_level_seconds": 3,
        "bench_warmup_requests": 1,
        "bench_server_port": _free_port(),
        "bench_state_dir": str(tmp_path / "servers"),
        "bench_workload": {"kind": "synthetic", "input_tokens": 1024, "output_tokens": 256,
                           "count": 32},
        "bench_max_tokens": 256,
    }


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = TOOLS
    env.update(extra)
    return env


def _servelab(args, cwd, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "servelab", *args], cwd=str(cwd),
                          env=env or _env(), text=True, capture_output=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("api-bench")
    events = []
    result = servelab.run_bench(extravars=_bench_vars(tmp_path),
                                results_root=str(tmp_path / "results"),
                                on_event=events.append, timeout=600)
    return tmp_path, result, events


@pytest.mark.slow
def test_run_bench_returns_the_run_directory_and_streams_events(bench_run):
    tmp_path, result, events = bench_run
    assert result.ok and result.status == "successful" and result.rc == 0
    run_dir = result.results_dir
    assert run_dir and os.path.dirname(run_dir) == str(tmp_path / "results")
    assert os.path.realpath(tmp_path / "results" / "latest") == os.path.realpath(run_dir)
    assert result.run_id == os.path.basename(run_dir)
    for name in ("levels.csv", "report.html", "summary.md", "manifest.json"):
        assert os.path.isfile(os.path.join(run_dir, name)), name
    with open(os.path.join(run_dir, "levels.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["profile"], int(r["concurrency"])) for r in rows} == {
        (p, c) for p in ("baseline", "eagle3") for c in LEVELS}
    # Every event reached the callback, from the start to the stats.
    # ("verbose" events are the lines Ansible prints outside a playbook event, such as a Python
    # warning at import; they reach the callback too, before the playbook's start.)
    kinds = [e.get("event") for e in events if e.get("event") != "verbose"]
    assert kinds[0] == "playbook_on_start" and kinds[-1] == "playbook_on_stats"
    tasks = {e["event_data"].get("task") for e in events if e.get("event") == "runner_on_ok"}
    assert {"servelab: preflight", "Open the run", "servelab: report"} <= tasks
    assert result.stats["failures"] == {} and not result.failures


@pytest.mark.slow
def test_a_bad_variable_raises_bench_error_naming_it_host_and_task(tmp_path):
    events = []
    extravars = _bench_vars(tmp_path)
    extravars.update(bench_concurrency=[], bench_api_key=SECRET)
    with pytest.raises(servelab.BenchError) as caught:
        servelab.run_bench(extravars=extravars, results_root=str(tmp_path / "results"),
                           on_event=events.append, timeout=300)
    err = caught.value
    assert err.host == "localhost"
    assert err.task == "servelab: preflight"
    assert "bench_concurrency" in err.message
    assert SECRET not in str(err) and SECRET not in err.message
    assert err.result is not None and err.result.rc != 0 and err.result.results_dir is None
    assert any(e.get("event") == "runner_on_failed" for e in events)
    # Nothing was measured: no run directory, no results/latest.
    root = tmp_path / "results"
    assert not root.exists() or not any(root.iterdir())


@pytest.mark.slow
def test_cli_bench_failure_exits_1_naming_host_and_task(tmp_path):
    done = _servelab(["bench", "--results-root", str(tmp_path / "results"),
                      "-e", "bench_concurrency=[]", "-e", "bench_server_port=%d" % _free_port(),
                      "-e", "bench_state_dir=%s" % (tmp_path / "servers")], tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "on localhost, task 'servelab: preflight'" in done.stderr
    assert "bench_concurrency" in done.stderr
    # The failure names its task; the line per task is -v's.
    assert "localhost: failed (task 'servelab: preflight')" in done.stdout


STRICT = os.path.join(REPO, "tests", "unit", "test_loadgen_strict_server.py")


@pytest.mark.slow
def test_cli_bench_of_one_endpoint_with_flags_only(tmp_path):
    """The common case (issue 28): one endpoint servelab did not start, no inventory and no vars
    file; the output shows the level's figures while it runs, the /metrics 404 warning that
    ansible-playbook shows, and no line per task."""
    from simproc import ServerProcess   # tests/ (conftest.py puts it on sys.path)

    env = _env(SERVELAB_LEVEL_PROGRESS_INTERVAL="0.2")
    with ServerProcess("--model", "m", script=STRICT) as srv:     # /metrics answers 404
        done = _servelab(["bench", "--base-url", srv.url, "--model", "m", "-c", "1",
                          "--level-seconds", "1", "--results-root", str(tmp_path / "results")],
                         tmp_path, env=env)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-3000:]
    assert "servelab bench: successful" in out
    assert not [line for line in out.splitlines() if line.startswith("-- ")], out[-4000:]
    # During the level: elapsed, requests done, tok/s so far (plugin_utils/progress.live_line).
    assert "llm_bench localhost/external C=1: " in out and " tok/s so far" in out, out[-4000:]
    assert "localhost: warning: llm_bench: no server metrics from %s/metrics" % srv.url in out
    assert "HTTP 404" in out
    with open(os.path.join(str(tmp_path / "results" / "latest"), "levels.csv"),
              newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["profile"], int(r["concurrency"])) for r in rows] == [("external", 1)]


@pytest.mark.parametrize("args", [["bench", "-e", "not-a-pair"], ["upgrade-cuda"],
                                  ["no-such-command"], []])
def test_cli_bad_usage_exits_2(tmp_path, args):
    done = _servelab(args, tmp_path, timeout=60)
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    assert done.stderr.strip()


def test_cli_help_documents_every_command(tmp_path):
    done = _servelab(["--help"], tmp_path, timeout=60)
    assert done.returncode == 0
    for word in ("bench", "report", "upgrade-cuda", "exit codes"):
        assert word in done.stdout
    for command in ("bench", "report", "upgrade-cuda"):
        sub = _servelab([command, "--help"], tmp_path, timeout=60)
        assert sub.returncode == 0 and "usage: servelab %s" % command in sub.stdout


def _no_ansible_env(tmp_path) -> dict:
    """PYTHONPATH whose first entry makes `import ansible` and `import ansible_runner` fail, and
    a PATH with no ansible-playbook on it: the report must need neither."""
    blocker = tmp_path / "blocker"
    for name in ("ansible", "ansible_runner"):
        (blocker / name).mkdir(parents=True, exist_ok=True)
        (blocker / name / "__init__.py").write_text(
            "raise ImportError('servelab report must not import %s')\n" % name)
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir(exist_ok=True)
    return _env(PYTHONPATH=os.pathsep.join([str(blocker), TOOLS]), PATH=str(empty_bin),
                MPLBACKEND="Agg")


@pytest.mark.slow
def test_cli_report_rebuilds_a_copied_run_without_ansible(bench_run, tmp_path):
    _unused, result, _events = bench_run
    copy = tmp_path / "copied-run"
    shutil.copytree(result.results_dir, copy, symlinks=True)
    os.unlink(copy / "report.html")
    shutil.rmtree(copy / "plots", ignore_errors=True)
    done = _servelab(["report", str(copy), "--compare-to", result.results_dir], tmp_path,
                     env=_no_ansible_env(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    html = (copy / "report.html").read_text()
    assert "eagle3" in html and "baseline" in html
    assert (copy / "plots" / "throughput.png").is_file()
    assert (copy / "plots" / "comparison.png").is_file()   # --compare-to reached the report
    # The summary table, then the files written.
    table, _sep, files = done.stdout.partition("files (")
    assert "eagle3" in table and "baseline" in table and "|" in table
    assert "  %s\n" % (copy / "report.html") in files      # written (not "(unchanged)")


def test_api_report_and_cli_report_of_a_directory_that_is_no_run(tmp_path):
    not_a_run = tmp_path / "not-a-run"
    not_a_run.mkdir()
    (not_a_run / "notes.txt").write_text("nothing measured here\n")
    with pytest.raises(servelab.ReportError, match="levels.csv"):
        servelab.report(str(not_a_run))
    env = _no_ansible_env(tmp_path)
    done = _servelab(["report", str(not_a_run)], tmp_path, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith("servelab report: ")
    assert "levels.csv" in done.stderr and str(not_a_run) in done.stderr
    assert "Traceback" not in done.stderr
    missing = _servelab(["report", str(tmp_path / "missing")], tmp_path, env=env)
    assert missing.returncode == 1 and "is not a directory" in missing.stderr


def _source_copy(dest) -> str:
    """The files a clean checkout has (tracked, and untracked but not ignored), copied: the wheel
    is built there, so the build leaves nothing (build/, *.egg-info) in this checkout."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = os.path.join(REPO, rel)
        if os.path.isfile(src) and not os.path.islink(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))
    return str(dest)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = _source_copy(tmp / "src")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", src, "-w",
                           str(tmp / "dist")], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    built = [p for p in (tmp / "dist").iterdir() if p.name.endswith(".whl")]
    assert len(built) == 1 and built[0].name.startswith("servelab-"), built
    return built[0]


def test_wheel_holds_the_package_the_collection_and_the_entry_point(wheel):
    base = "servelab/_collection/ansible_collections/servelab/serving/"
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        for must in ("servelab/__init__.py", "servelab/cli.py", "servelab/__main__.py",
                     base + "plugins/modules/llm_bench.py", base + "plugins/action/llm_bench.py",
                     base + "plugins/plugin_utils/report/build.py", base + "galaxy.yml",
                     base + "bench.yml", base + "upgrade-cuda.yml", base + "tune.yml",
                     base + "ansible.cfg", base + "requirements.txt",
                     base + "playbooks/bench.yml", base + "roles/bench/tasks/main.yml",
                     base + "inventory/local/hosts.yml", base + "meta/runtime.yml"):
            assert must in names, must
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        assert not [n for n in names if n.startswith((base + "tests/", base + ".venv/"))]
        entry = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert len(entry) == 1
        text = whl.read(entry[0]).decode()
        assert "[console_scripts]" in text and "servelab = servelab.cli:main" in text
    # The build hook and the package agree on what the collection is.
    assert _build.COLLECTION_ITEMS == _paths.COLLECTION_ITEMS


def test_installed_wheel_uses_its_own_copy_of_the_collection(wheel, tmp_path):
    """Unpacked into a folder of its own (never into the shared venv) and run from outside the
    checkout: the package finds the collection it ships, not this checkout."""
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(target)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANSIBLE_CONFIG")}
    env["PYTHONPATH"] = str(target)
    done = subprocess.run(
        [sys.executable, "-c", "import servelab; print(servelab.collection_root())"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    root = done.stdout.strip()
    assert root == str(target / "servelab" / "_collection" / "ansible_collections" / "servelab"
                       / "serving")
    assert os.path.isfile(os.path.join(root, "plugins", "modules", "llm_bench.py"))
    helped = subprocess.run([sys.executable, "-m", "servelab", "report", "--help"],
                            cwd=str(tmp_path), env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert helped.returncode == 0 and "RESULTS_DIR" in helped.stdout
