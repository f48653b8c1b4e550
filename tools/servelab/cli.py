"""`servelab`: bench.yml, upgrade-cuda.yml and the report from the command line.

    servelab bench [-i INVENTORY] [-e KEY=VALUE|-e @FILE|-e JSON]... [--limit HOSTS] [-v]
    servelab bench --base-url URL --model NAME [-c 1,2,4] [--level-seconds 20]
    servelab tune [-i INVENTORY] [-e ...] [--space FLAG=V1,V2]... [--slo ttft_ms=500] [--trials N]
    servelab report RESULTS_DIR [--compare-to OLD_RESULTS_DIR] [--baseline NAME]
    servelab upgrade-cuda -i INVENTORY [-e ...] [--limit HOSTS] [-v] [--check]

Exit codes: 0 the play (or the report) succeeded, 1 it failed (the message names the host and the
task, or what is missing in the results directory), 2 bad usage.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import List, Optional

from . import _flags
from . import _tune_flags

EPILOG = """\
exit codes: 0 ok, 1 the play or the report failed (host and task named), 2 bad usage

examples:
  servelab bench                                    # the embedded default: this machine, the simulator
  servelab bench --base-url http://10.0.0.5:8000 --model my-model -c 1,2,4 --level-seconds 20
  servelab bench -e '{"bench_concurrency": [1, 2, 5]}' -e bench_level_seconds=10
  servelab bench -i inventory/mine -e @bench-vars.yml --limit gpu1
  servelab tune --space max_running_requests=16,32,64 --slo ttft_ms=500,tpot_ms=50 --trials 6
  servelab report results/latest --compare-to results/20261201T101500Z-123456
  servelab upgrade-cuda -i inventory/mine --check
"""


class UsageError(Exception):
    pass


def _parse_extra(values: List[str]) -> dict:
    """-e as ansible-playbook reads it: KEY=VALUE (VALUE as YAML), @FILE (YAML/JSON), or a JSON
    or YAML mapping; later ones win."""
    import yaml

    out: dict = {}
    for value in values or []:
        if value.startswith("@"):
            path = os.path.expanduser(value[1:])
            try:
                with open(path, encoding="utf-8") as fh:
                    data = yaml.safe_load(fh)
            except (OSError, yaml.YAMLError) as exc:
                raise UsageError("-e %s: cannot read it: %s" % (value, exc)) from None
        elif value.lstrip().startswith(("{", "[")):
            try:
                data = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                raise UsageError("-e %s: not a JSON/YAML mapping: %s" % (value, exc)) from None
        elif "=" in value:
            key, _sep, raw = value.partition("=")
            if not key.strip():
                raise UsageError("-e %s: KEY=VALUE needs a key" % value)
            try:
                parsed = yaml.safe_load(raw) if raw.strip() else raw
            except yaml.YAMLError:
                parsed = raw
            data = {key.strip(): parsed}
        else:
            raise UsageError("-e %s: write KEY=VALUE, @FILE or a JSON mapping" % value)
        if data is None:
            continue
        if not isinstance(data, dict):
            raise UsageError("-e %s: extra variables must be a mapping, not %s"
                             % (value, type(data).__name__))
        out.update(data)
    return out


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _Printer:
    """What `servelab bench` streams from the events. By default: a line per play, every line
    ansible-playbook printed outside a task result (`verbose` events: llm_bench's per-level
    progress and its figures during a level, the servelab.serving.progress callback's lines, the
    levels table and the report at the end), each failed or unreachable host with its task, and
    every warning a task returned (ansible-playbook prints them as [WARNING] lines inside the
    task's result, which the default here does not show). -v adds a line per task and each
    host's ok/changed/skipped, -vv prints ansible-playbook's whole output instead."""

    # The events whose result may carry `warnings` (a loop's items, then the task's own).
    RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable",
                     "runner_on_skipped", "runner_item_on_ok", "runner_item_on_failed",
                     "runner_item_on_skipped")

    def __init__(self, stream=None, verbosity: int = 0):
        self.stream, self.verbosity = stream or sys.stdout, verbosity
        self._warned: set = set()     # (task, host, text): a loop's items and its task repeat them

    def say(self, text: str):
        print(text, file=self.stream, flush=True)

    def lines(self, event: dict):
        for line in (event.get("stdout") or "").splitlines():
            line = ANSI.sub("", line).rstrip()
            if line.strip():
                yield line

    def warnings(self, event: dict) -> list:
        """The warnings and deprecations of a task's result, once per task and host."""
        data = event.get("event_data") or {}
        res = data.get("res")
        if event.get("event") not in self.RESULT_EVENTS or not isinstance(res, dict):
            return []
        out = []
        found = [("warning", w) for w in res.get("warnings") or []] + [
            ("deprecation", d.get("msg") if isinstance(d, dict) else d)
            for d in res.get("deprecations") or []]
        for kind, text in found:
            text = ANSI.sub("", str(text or "")).strip()
            key = (data.get("task_uuid") or data.get("task"), data.get("host"), text)
            if text and key not in self._warned:
                self._warned.add(key)
                out.append("   %s: %s: %s" % (data.get("host"), kind, text))
        return out

    def __call__(self, event: dict):
        kind = event.get("event")
        data = event.get("event_data") or {}
        if self.verbosity >= 2:
            for line in self.lines(event):
                self.say(line)
            return
        if kind == "playbook_on_play_start":
            self.say("== %s" % (data.get("play") or data.get("name") or "play"))
        elif kind == "playbook_on_task_start" and self.verbosity >= 1:
            self.say("-- %s" % (data.get("task") or data.get("name")))
        elif kind in ("runner_on_failed", "runner_on_unreachable"):
            tag = "ignored" if data.get("ignore_errors") else (
                "unreachable" if kind == "runner_on_unreachable" else "failed")
            res = data.get("res") or {}
            msg = str(res.get("msg") or "").strip().splitlines()
            # Without the task lines of -v, the failure names its task.
            task = "" if self.verbosity >= 1 else " (task %r)" % data.get("task")
            self.say("   %s: %s%s%s" % (data.get("host"), tag, task,
                                        (": " + msg[0][:300]) if msg else ""))
        elif kind == "verbose":
            for line in self.lines(event):
                self.say(line)
        elif self.verbosity >= 1 and kind in ("runner_on_ok", "runner_on_skipped"):
            res = data.get("res") or {}
            tag = "skipped" if kind == "runner_on_skipped" else (
                "changed" if res.get("changed") else "ok")
            self.say("   %s: %s" % (data.get("host"), tag))
        for line in self.warnings(event):
            self.say(line)


def bench_extravars(args, extravars: dict) -> dict:
    """-e's variables plus those of the common-case flags (_flags.py); UsageError naming the
    flag when one is bad."""
    flags = _flags.BenchFlags(base_url=args.base_url, model=args.model,
                              concurrency=args.concurrency, level_seconds=args.level_seconds,
                              profile=args.profile)
    if args.base_url is not None and args.model is None and "bench_model" not in extravars:
        raise UsageError("--base-url needs --model NAME: the model name the endpoint serves "
                         "(GET <base_url>/v1/models lists them)")
    try:
        return _flags.merge(_flags.flag_vars(flags), extravars, _flags.FLAG_OF)
    except _flags.FlagError as exc:
        raise UsageError(str(exc)) from None


def tune_extravars(args, extravars: dict) -> dict:
    """-e's variables plus those of tune's flags (_tune_flags.py); UsageError naming the flag."""
    flags = _tune_flags.TuneFlags(space=args.space or [], slo=args.slo, trials=args.trials,
                                  minutes=args.minutes, metric=args.metric, resume=args.resume)
    try:
        return _flags.merge(_tune_flags.tune_vars(flags), extravars, _tune_flags.TUNE_FLAG_OF)
    except _flags.FlagError as exc:
        raise UsageError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servelab", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Benchmark LLM serving profiles (bench.yml), upgrade a GPU host's CUDA "
                    "stack (upgrade-cuda.yml), and rebuild a run's report without Ansible.",
        epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def play_options(p, inventory_required):
        p.add_argument("-i", "--inventory", required=inventory_required,
                       help="inventory path or host list" + (
                           "" if inventory_required else
                           " (default: the embedded inventory/local, this machine and the "
                           "simulator)"))
        p.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                       help="KEY=VALUE (VALUE read as YAML), @FILE (YAML/JSON) or a JSON "
                            "mapping; repeatable, later ones win")
        p.add_argument("-l", "--limit", help="further limit the hosts (ansible-playbook --limit)")
        p.add_argument("-v", "--verbose", action="count", default=0,
                       help="-v: also each host's ok/changed per task; -vv: ansible-playbook's "
                            "whole output; -vvv and more are passed on to ansible-playbook")
        p.add_argument("--check", action="store_true",
                       help="show what would run; start and change nothing")

    bench = sub.add_parser(
        "bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run bench.yml: sweep every profile on every GPU server, then report",
        description="Run bench.yml through ansible-runner; prints servelab's progress (before "
                    "and during each level), failures and warnings (-v: a line per task too), "
                    "then the results directory. --base-url benchmarks one endpoint with no "
                    "inventory and no vars file.",
        epilog=EPILOG)
    play_options(bench, False)
    common = bench.add_argument_group(
        "the common case", "each flag sets one bench variable (a flag and a -e setting the same "
        "one are refused); --base-url needs no inventory: this machine is the bench client")
    common.add_argument("--base-url", metavar="URL",
                        help="benchmark this endpoint (one that servelab does not start): one "
                             "profile, engine external, at bench_base_url=URL")
    common.add_argument("--model", metavar="NAME",
                        help="the model name the endpoint serves (bench_model)")
    common.add_argument("--profile", metavar="NAME",
                        help="the --base-url profile's name in the results (default: %s)"
                             % _flags.EXTERNAL_PROFILE)
    common.add_argument("-c", "--concurrency", metavar="C1,C2,...",
                        help="the levels, e.g. 1,2,4 (bench_concurrency)")
    common.add_argument("--level-seconds", metavar="S",
                        help="each level's measurement window in seconds (bench_level_seconds)")
    bench.add_argument("--results-root",
                       help="where the run directory goes (default $SERVELAB_RESULTS_ROOT, else "
                            "the checkout's results/, else ./results)")

    tune = sub.add_parser(
        "tune", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run tune.yml: find the serving flags that give the most goodput under the SLO",
        description="Run tune.yml through ansible-runner (docs/tune.md): each trial is a profile "
                    "run through bench.yml's own path, each trial's load searched by bisection; "
                    "prints the trials and where the best profile is (tune/best.yml in the run "
                    "directory). Without -i: the embedded default (the simulator).",
        epilog=EPILOG)
    play_options(tune, False)
    flags = tune.add_argument_group(
        "the common case", "each flag sets one variable (a flag and a -e setting the same one "
        "are refused); the rest (tune_base_profile, tune_axis, tune_tolerance, ...) by -e")
    flags.add_argument("--space", action="append", metavar="FLAG=V1,V2",
                       help="a searched engine flag and its values (repeatable): tune_space")
    flags.add_argument("--slo", metavar="ttft_ms=MS,tpot_ms=MS",
                       help="the SLO the goodput is counted under (bench_slo)")
    flags.add_argument("--trials", metavar="N", help="the budget in trials (tune_budget.trials)")
    flags.add_argument("--minutes", metavar="M", help="the budget in minutes (tune_budget.minutes)")
    flags.add_argument("--metric", metavar="goodput|output_tok_s",
                       help="what to maximise (tune_objective.metric, at p99)")
    flags.add_argument("--resume", metavar="RUN_ID",
                       help="continue an interrupted tune, keeping its finished trials "
                            "(bench_resume)")
    tune.add_argument("--results-root",
                      help="where the run directory goes (as for servelab bench)")

    rep = sub.add_parser(
        "report", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="rebuild a run's report from its results directory (no Ansible)",
        description="Rebuild summary.md, report.html, plots/ and the exports of a run directory "
                    "(pandas and matplotlib; Ansible is not used). Prints the side-by-side "
                    "table and the files written.",
        epilog=EPILOG)
    rep.add_argument("results_dir", metavar="RESULTS_DIR", help="a run directory "
                     "(results/<run_id>, or results/latest)")
    rep.add_argument("--compare-to", metavar="OLD", help="an earlier run directory to compare with")
    rep.add_argument("--baseline", default="baseline",
                     help="the profile speedups are measured against (default: baseline)")
    rep.add_argument("--no-plots", action="store_true", help="skip the plots (faster)")

    cuda = sub.add_parser(
        "upgrade-cuda", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run upgrade-cuda.yml: the Proxmox host, then the container's CUDA stack",
        description="Run upgrade-cuda.yml through ansible-runner on INVENTORY (required).",
        epilog=EPILOG)
    play_options(cuda, True)
    return parser


def _play(args, printer) -> int:
    import servelab

    extravars = _parse_extra(args.extra_vars)
    if args.command == "bench":
        extravars = bench_extravars(args, extravars)
    elif args.command == "tune":
        extravars = tune_extravars(args, extravars)
    common = dict(extravars=extravars, on_event=printer, limit=args.limit,
                  verbosity=max(args.verbose - 2, 0), check=args.check)
    try:
        if args.command == "bench":
            result = servelab.run_bench(inventory=args.inventory,
                                        results_root=args.results_root, **common)
        elif args.command == "tune":
            result = servelab.run_tune(inventory=args.inventory,
                                       results_root=args.results_root, **common)
        else:
            result = servelab.upgrade_cuda(args.inventory, **common)
    except servelab.BenchError as exc:
        where = ""
        if exc.host or exc.task:
            where = " on %s, task %r" % (exc.host or "?", exc.task or "?")
        print("servelab %s: failed%s:\n%s" % (args.command, where, exc.message), file=sys.stderr)
        run = exc.result
        if run is not None and run.results_dir:
            print("results (what finished): %s" % run.results_dir, file=sys.stderr)
        return 1
    if args.command in ("bench", "tune") and result.results_dir:
        printer.say("results: %s" % result.results_dir)
        best = os.path.join(result.results_dir, "tune", "best.yml")
        if args.command == "tune" and os.path.isfile(best):
            printer.say("best profile: %s (bench.yml -e @%s runs it)" % (best, best))
    printer.say("servelab %s: %s" % (args.command, result.status))
    return 0


def _report(args, printer) -> int:
    import servelab

    try:
        result = servelab.report(args.results_dir, compare_to=args.compare_to,
                                 baseline=args.baseline, with_plots=not args.no_plots)
    except servelab.ReportError as exc:
        print("servelab report: %s" % exc, file=sys.stderr)
        return 1
    printer.say(result.table)
    if result.msg:
        printer.say("")
        printer.say(result.msg)
    for warning in result.warnings:
        printer.say("warning: %s" % warning)
    printer.say("")
    printer.say("files (%s):" % result.results_dir)
    written = set(result.written)
    for rel in sorted(result.files):
        printer.say("  %s%s" % (os.path.join(result.results_dir, rel),
                                "" if rel in written else "  (unchanged)"))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:           # argparse: 2 for bad usage, 0 for --help
        return int(exc.code or 0)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    printer = _Printer(verbosity=getattr(args, "verbose", 0))
    try:
        if args.command == "report":
            return _report(args, printer)
        return _play(args, printer)
    except UsageError as exc:
        print("servelab %s: %s" % (args.command, exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
