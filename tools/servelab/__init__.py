"""servelab's Python API: the collection's playbooks through ansible-runner, and the report.

    import servelab
    run = servelab.run_bench(extravars={"bench_concurrency": [1, 2]}, on_event=print)
    run.results_dir                       # results/<run_id>/ (levels.csv, report.html, ...)
    servelab.report(run.results_dir, compare_to="results/<older run_id>").table
    servelab.upgrade_cuda("inventory/<yours>")
    tune = servelab.run_tune(extravars={"tune_space": {"max_running_requests": [16, 64, 256]},
                                        "bench_slo": {"ttft_ms": 500}})
    tune.results_dir                      # results/<run_id>/ (tune/best.yml, tune/trials.csv)

run_bench and upgrade_cuda raise BenchError(host, task, message) when the play fails; report needs
no Ansible (pandas and matplotlib), and raises ReportError. `servelab --help` is the same as a CLI.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

from ._runner import BenchError, RunResult

# servelab.ReportError (the report's own exception) is loaded on first use: see __getattr__.
__all__ = ["BenchError", "RunResult", "report", "run_bench", "run_tune", "upgrade_cuda",
           "collection_root"]


def collection_root() -> str:
    """The directory of the collection servelab.serving this package runs (the checkout, or the
    copy installed with the wheel)."""
    from . import _paths
    return _paths.locate().root


def _results_root(results_root, coll) -> Optional[str]:
    if results_root:
        return os.path.abspath(os.path.expanduser(str(results_root)))
    if os.environ.get("SERVELAB_RESULTS_ROOT"):
        return os.path.abspath(os.path.expanduser(os.environ["SERVELAB_RESULTS_ROOT"]))
    # A checkout keeps bench.yml's default (its own results/); an installed copy must not write
    # inside site-packages: ./results of the current directory.
    return None if coll.checkout else os.path.abspath("results")


def run_bench(inventory: Optional[str] = None, extravars: Optional[dict] = None,
              results_root: Optional[str] = None, on_event: Optional[Callable[[dict], Any]] = None,
              limit: Optional[str] = None, verbosity: int = 0, *,
              envvars: Optional[dict] = None, cancel_callback: Optional[Callable[[], bool]] = None,
              timeout: Optional[int] = None, check: bool = False) -> RunResult:
    """Run bench.yml and return a RunResult whose `results_dir` is the run directory it wrote.

    inventory: a path or host list; None is the embedded default (`inventory/local`: this machine,
    the simulator). extravars: bench_* variables (`-e`). results_root: where run directories go
    (default `$SERVELAB_RESULTS_ROOT`, else the checkout's results/, else ./results).
    on_event: called with every ansible-runner event (a dict: `event`, `event_data`, `stdout`).
    limit, verbosity: ansible-playbook's --limit and -v count. cancel_callback: returns True to
    stop the run (the interrupted run is cleaned up as on Ctrl-C). Raises BenchError naming the
    first failed host and task (a bad variable fails the preflight before anything runs)."""
    return _run_bench_like("bench.yml", inventory, extravars, results_root, on_event, limit,
                           verbosity, envvars=envvars, cancel_callback=cancel_callback,
                           timeout=timeout, check=check)


def _run_bench_like(playbook, inventory, extravars, results_root, on_event, limit, verbosity, *,
                    envvars, cancel_callback, timeout, check) -> RunResult:
    """bench.yml or tune.yml: a run with a results directory."""
    from . import _paths
    from ._runner import run_playbook

    coll = _paths.locate()
    env = dict(envvars or {})
    root = _results_root(results_root, coll)
    extravars = dict(extravars or {})
    if root:
        env.setdefault("SERVELAB_RESULTS_ROOT", root)
    if inventory is None and not coll.checkout and "bench_state_dir" not in extravars:
        # inventory/local keeps its servers' state beside results/: not in site-packages.
        extravars["bench_state_dir"] = os.path.join(root, ".servers")
    result = run_playbook(playbook, inventory=inventory, extravars=extravars,
                          on_event=on_event, limit=limit, verbosity=verbosity, envvars=env,
                          cancel_callback=cancel_callback, timeout=timeout, check=check)
    if result.results_dir is None and not check:
        latest = os.path.join(root or os.path.join(coll.root, "results"), "latest")
        if os.path.isdir(latest):
            result.results_dir = os.path.realpath(latest)
    if result.results_dir and result.run_id is None:
        result.run_id = os.path.basename(result.results_dir)
    return result


def run_tune(inventory: Optional[str] = None, extravars: Optional[dict] = None,
             results_root: Optional[str] = None, on_event: Optional[Callable[[dict], Any]] = None,
             limit: Optional[str] = None, verbosity: int = 0, *,
             envvars: Optional[dict] = None, cancel_callback: Optional[Callable[[], bool]] = None,
             timeout: Optional[int] = None, check: bool = False) -> RunResult:
    """Run tune.yml (docs/tune.md): the serving flags of `tune_space` that give the most goodput
    under the SLO, each trial a profile run through bench.yml's own path. Arguments and result as
    run_bench's; `results_dir` holds tune/best.yml (the profile to paste into group_vars),
    tune/trials.csv and the report. A resumed tune: extravars bench_resume=<run_id>."""
    return _run_bench_like("tune.yml", inventory, extravars, results_root, on_event, limit,
                           verbosity, envvars=envvars, cancel_callback=cancel_callback,
                           timeout=timeout, check=check)


def upgrade_cuda(inventory: str, extravars: Optional[dict] = None,
                 on_event: Optional[Callable[[dict], Any]] = None, limit: Optional[str] = None,
                 verbosity: int = 0, *, envvars: Optional[dict] = None,
                 cancel_callback: Optional[Callable[[], bool]] = None,
                 timeout: Optional[int] = None, check: bool = False) -> RunResult:
    """Run upgrade-cuda.yml on `inventory` (required: it changes the hosts' CUDA stack); the same
    events, result and BenchError as run_bench (results_dir stays None)."""
    from ._runner import run_playbook

    if not inventory:
        raise ValueError("upgrade_cuda needs an inventory (a path or a host list)")
    return run_playbook("upgrade-cuda.yml", inventory=inventory, extravars=extravars,
                        on_event=on_event, limit=limit, verbosity=verbosity, envvars=envvars,
                        cancel_callback=cancel_callback, timeout=timeout, check=check)


def report(results_dir: str, compare_to: Optional[str] = None, baseline: str = "baseline",
           with_plots: bool = True, write: bool = True):
    """Rebuild a run's report from its directory alone (plugin_utils/report/build.py; pandas and
    matplotlib, no Ansible): summary.md, report.html, plots/, the exports. Returns the
    ReportResult (table, crossover, recommendation, warnings; `written`: the files that changed).
    Raises ReportError when the directory is not a run's, naming what is missing."""
    from . import _paths

    _paths.importable()
    from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import (
        ReportError,
        build_report,
        write_report,
    )

    if not os.path.isdir(results_dir):
        raise ReportError("%s is not a directory: pass a run directory (results/<run_id>)"
                          % results_dir)
    result = build_report(results_dir, baseline=baseline, compare_to=compare_to,
                          with_plots=with_plots)
    result.written = write_report(result) if write else []
    return result


def __getattr__(name):
    # ReportError lives with the report code, which imports pandas: loaded when first named.
    if name == "ReportError":
        from . import _paths
        _paths.importable()
        from ansible_collections.servelab.serving.plugins.plugin_utils.report.data import (
            ReportError as error,
        )
        return error
    raise AttributeError(name)
