"""`servelab`: bench.yml, upgrade-cuda.yml and the report from the command line.

    servelab bench [-i INVENTORY] [-e KEY=VALUE|-e @FILE|-e JSON]... [--limit HOSTS] [-v]
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

EPILOG = """\
exit codes: 0 ok, 1 the play or the report failed (host and task named), 2 bad usage

examples:
  servelab bench                                    # the embedded default: this machine, the simulator
  servelab bench -e '{"bench_concurrency": [1, 2, 5]}' -e bench_level_seconds=10
  servelab bench -i inventory/mine -e @bench-vars.yml --limit gpu1
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
    """What `servelab bench` streams from the events: a line per play and per task, each failed or
    unreachable host, and every line ansible-playbook printed outside a task result (`verbose`
    events: llm_bench's per-level progress, the servelab.serving.progress callback's lines, the
    levels table and the report at the end, warnings). -v adds each host's ok/changed/skipped,
    -vv prints ansible-playbook's whole output instead."""

    def __init__(self, stream=None, verbosity: int = 0):
        self.stream, self.verbosity = stream or sys.stdout, verbosity

    def say(self, text: str):
        print(text, file=self.stream, flush=True)

    def lines(self, event: dict):
        for line in (event.get("stdout") or "").splitlines():
            line = ANSI.sub("", line).rstrip()
            if line.strip():
                yield line

    def __call__(self, event: dict):
        kind = event.get("event")
        data = event.get("event_data") or {}
        if self.verbosity >= 2:
            for line in self.lines(event):
                self.say(line)
        elif kind == "playbook_on_play_start":
            self.say("== %s" % (data.get("play") or data.get("name") or "play"))
        elif kind == "playbook_on_task_start":
            self.say("-- %s" % (data.get("task") or data.get("name")))
        elif kind in ("runner_on_failed", "runner_on_unreachable"):
            tag = "ignored" if data.get("ignore_errors") else (
                "unreachable" if kind == "runner_on_unreachable" else "failed")
            res = data.get("res") or {}
            msg = str(res.get("msg") or "").strip().splitlines()
            self.say("   %s: %s%s" % (data.get("host"), tag, (": " + msg[0][:300]) if msg else ""))
        elif kind == "verbose":
            for line in self.lines(event):
                self.say(line)
        elif self.verbosity >= 1 and kind in ("runner_on_ok", "runner_on_skipped"):
            res = data.get("res") or {}
            tag = "skipped" if kind == "runner_on_skipped" else (
                "changed" if res.get("changed") else "ok")
            self.say("   %s: %s" % (data.get("host"), tag))


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
        description="Run bench.yml through ansible-runner; prints a line per task and "
                    "servelab's per-level progress, then the results directory.",
        epilog=EPILOG)
    play_options(bench, False)
    bench.add_argument("--results-root",
                       help="where the run directory goes (default $SERVELAB_RESULTS_ROOT, else "
                            "the checkout's results/, else ./results)")

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
    common = dict(extravars=extravars, on_event=printer, limit=args.limit,
                  verbosity=max(args.verbose - 2, 0), check=args.check)
    try:
        if args.command == "bench":
            result = servelab.run_bench(inventory=args.inventory,
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
    if args.command == "bench" and result.results_dir:
        printer.say("results: %s" % result.results_dir)
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
