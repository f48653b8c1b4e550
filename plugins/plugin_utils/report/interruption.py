"""What the report says about a run that did not finish: how it ended, what it measured, how
to continue it.

What was seen (issue 26): after Ctrl-C, manifest.json said `status: interrupted` with the level
in flight, while summary.md and report.html said "finished not recorded" and "its sweep did not
finish (status started)". The report is written from the run's final status (bench_run's close,
before bench_report): an interrupted or aborted run names the interruption (its reason: the
signal, or "cleaned up by hand" after a SIGKILL; when; the level in flight, which is lost and
measured again on resume), lists what was measured, and gives the resume command (the
interrupted ansible-playbook's own, recorded by the interrupt cleanup; without one, built from
the manifest's inventory).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field

ENDED = ("interrupted", "aborted")


@dataclass(frozen=True)
class Interruption:
    status: str                      # interrupted | aborted
    at: str | None                   # when the run was closed (interrupted_at / aborted_at)
    reason: str                      # SIGINT, SIGTERM, "cleaned up by hand", ...
    in_flight: list = field(default_factory=list)   # [{host, profile, level, started_at, ...}]
    resume_command: str = ""


def _text(value) -> str:
    return "" if value in (None, "") else str(value)


def interruption(manifest: dict, run_id: str) -> Interruption | None:
    """The run's interruption, from its final status; None for a run that finished or is still
    open (status started: nothing has closed it yet)."""
    status = _text(manifest.get("status")).lower()
    if status not in ENDED:
        return None
    flights = [f for f in manifest.get("level_in_flight") or () if isinstance(f, dict)]
    command = _text(manifest.get("resume_command"))
    if not command:
        inventories = [str(i) for i in manifest.get("inventory") or () if i]
        cmd = ["ansible-playbook"]
        for inv in inventories:
            cmd += ["-i", inv]
        command = shlex.join(cmd + ["-e", "bench_resume=%s" % run_id, "bench.yml"])
    return Interruption(status=status, at=_text(manifest.get(status + "_at")) or None,
                        reason=_text(manifest.get("interrupt_reason")) or status,
                        in_flight=flights, resume_command=command)


def _flight(f: dict) -> str:
    level = _text(f.get("level")) or ("C=%s" % f.get("concurrency"))
    repeat = f.get("repeat")
    return "%s %s%s on %s" % (f.get("profile", "?"), level,
                              " (repeat %s)" % repeat if repeat and int(repeat) > 1 else "",
                              f.get("host", "?"))


def headline(intr: Interruption) -> str:
    """One line: how the run ended, and the level it lost."""
    line = "run %s (%s) at %s" % (intr.status, intr.reason, intr.at or "a time not recorded")
    if intr.in_flight:
        line += "; level in flight, not measured: " + ", ".join(_flight(f) for f in intr.in_flight)
    else:
        line += "; no level was in flight"
    return line


def measured_lines(levels) -> list:
    """'baseline on localhost: C=1, C=2' per (profile, host) that has measured levels."""
    if levels is None or len(levels) == 0:
        return ["nothing was measured"]
    out = []
    for (profile, host), rows in levels.groupby(["profile", "host"], sort=True):
        conc = sorted({int(c) for c in rows["concurrency"]})
        out.append("%s on %s: %s" % (profile, host, ", ".join("C=%d" % c for c in conc)))
    return out


def lines(intr: Interruption, levels) -> list:
    """The report's 'Run interrupted' section."""
    out = [headline(intr)]
    out += ["measured: " + m for m in measured_lines(levels)]
    out.append("to measure the rest (the measured levels are kept): " + intr.resume_command)
    return out
