"""Live progress of a benchmark run (controller only): where a sweep stands, how long the run has
taken and how long it will take, which task names the progress callback reports, the server's
last log line while it starts, and the end-of-run table of levels.

The llm_bench action prints `progress_line` before each level; the progress callback
(plugins/callback/progress.py) uses the task-name match, the heartbeat's log line and
`levels_table`. The figures of a level are never formatted here: every cell comes from
module_utils/results/level_views.py (the field table's formats), as on the live line and in the
report.
"""
from __future__ import annotations

import datetime
import math
import os
import re
import statistics
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Sequence

from ansible_collections.servelab.serving.plugins.module_utils import redact
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    level_flags, level_verdict,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import (
    cell_header, cell_text, format_value, level_label,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    FIELD, KIND_STR, LAYOUTS, LOAD_MODE_RATE, VIEW_LINE,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    part_stem, row_repeat,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.table import Table

SEP = " · "
# Before any level of the run has been measured, a level is guessed to take its window plus
# this per request of warm-up (each worker's), plus one request for the window's tail: a
# request of a few hundred tokens takes seconds on a real engine. Labelled "~" on the line.
REQUEST_GUESS_S = 2.0
LOG_LINE_MAX = 200

# Ansible names a role's task "<role> : <task name>" ("servelab.serving.bench : servelab: sweep
# baseline"; the role's short name before ansible-core 2.19's FQCN). A role name has no spaces
# and no colon, so a task name of its own ("servelab: a : b") is never taken for one.
_ROLE_PREFIX = re.compile(r"^[A-Za-z0-9_.\-]+ : ")


# -- task names --------------------------------------------------------------------------------

def bare_task_name(name: str) -> str:
    """A task's own name, without the "<role> : " Ansible puts before a role's task names."""
    name = str(name or "").strip()
    return _ROLE_PREFIX.sub("", name, count=1)


def is_servelab_task(name: str, prefix: str = "servelab:") -> bool:
    """Whether the progress callback reports a task live: its own name (a role's task too)
    starts with the prefix."""
    return bool(prefix) and bare_task_name(name).startswith(prefix)


# -- time --------------------------------------------------------------------------------------

def clock(seconds: Optional[float]) -> str:
    """01:42, or 1:02:03 from an hour on; "--:--" when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "--:--"
    total = max(0, int(round(seconds)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return "%d:%02d:%02d" % (hours, minutes, secs) if hours else "%02d:%02d" % (minutes, secs)


def parse_time(text) -> Optional[float]:
    """An ISO 8601 time (the manifest's started_at) as epoch seconds; None when it is not one."""
    if not text or not isinstance(text, str):
        return None
    try:
        stamp = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return stamp.timestamp()


def run_started(manifest: Mapping) -> Optional[float]:
    """When this run (this ansible-playbook) started, from the manifest: `resumed_at` for a
    resumed run (the time between the first attempt and the resume is nobody's), else
    `started_at`."""
    for key in ("resumed_at", "started_at"):
        when = parse_time(manifest.get(key))
        if when is not None:
            return when
    return None


def server_start_seconds(manifest: Mapping) -> float:
    """The average time a server of this run took to be ready (the manifest's
    profiles.<profile>.<host>.ready_seconds), 0 when none is recorded."""
    found = []
    for hosts in (manifest.get("profiles") or {}).values():
        for record in (hosts.values() if isinstance(hosts, Mapping) else ()):
            value = record.get("ready_seconds") if isinstance(record, Mapping) else None
            try:
                seconds = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(seconds) and seconds >= 0:
                found.append(seconds)
    return statistics.fmean(found) if found else 0.0


# -- the ETA -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Eta:
    seconds: float
    guessed: bool          # no level measured yet: a guess from level_seconds and warm-up
    levels_left: int       # this level included

    def text(self) -> str:
        return "ETA " + ("~" if self.guessed else "") + clock(self.seconds)


def guess_level_seconds(level_seconds: float, warmup_requests: int = 0,
                        request_guess_s: float = REQUEST_GUESS_S) -> float:
    """A level's wall time before any was measured: the window, each worker's warm-up requests
    and the window's tail."""
    return float(level_seconds or 0) + (max(0, int(warmup_requests or 0)) + 1) * request_guess_s


def levels_left(level_index: int, level_count: int, profile_index: Optional[int] = None,
                profile_count: Optional[int] = None) -> int:
    """Levels still to run before the run ends, the one about to start included: the rest of
    this profile's, plus every level of each profile after this one (1-based indexes)."""
    here = max(0, level_count - level_index + 1)
    profiles_after = profiles_left(profile_index, profile_count)
    return here + level_count * profiles_after


def profiles_left(profile_index: Optional[int], profile_count: Optional[int]) -> int:
    """Profiles after this one; 0 when the sweep does not know where it stands in the run."""
    if not profile_index or not profile_count:
        return 0
    return max(0, int(profile_count) - int(profile_index))


def estimate_eta(level_walls: Sequence[float], level_index: int, level_count: int,
                 profile_index: Optional[int] = None, profile_count: Optional[int] = None,
                 guess_s: float = 0.0, profile_overhead_s: float = 0.0) -> Eta:
    """The time left in the run before level `level_index` of `level_count` starts: the average
    wall time of the levels measured so far in the run (`level_walls`, seconds), else `guess_s`
    (then `guessed`), times the levels left (this profile's, plus level_count per profile left),
    plus `profile_overhead_s` (a server start, when known) per profile left."""
    walls = [float(w) for w in level_walls if w is not None and math.isfinite(w) and w >= 0]
    per_level = statistics.fmean(walls) if walls else float(guess_s)
    left = levels_left(level_index, level_count, profile_index, profile_count)
    seconds = per_level * left + max(0.0, float(profile_overhead_s or 0)) * profiles_left(
        profile_index, profile_count)
    return Eta(seconds=seconds, guessed=not walls, levels_left=left)


def progress_line(level_index: int, level_count: int, label: str, elapsed_s: Optional[float],
                  eta: Eta, profile: Optional[str] = None, profile_index: Optional[int] = None,
                  profile_count: Optional[int] = None, repeat: Optional[int] = None,
                  repeats: Optional[int] = None) -> str:
    """'profile 2/2 eagle3 · level 3/8 C=5 · repeat 2/3 · 01:42 elapsed · ETA 02:10'; without
    the profile's place in the run, the profile part is left out; the repeat part is there only
    when each level is measured more than once (the ETA then counts levels x repeats: the
    caller passes it so)."""
    parts = []
    if profile_index and profile_count:
        parts.append("profile %d/%d %s" % (profile_index, profile_count, profile or "?"))
    parts.append("level %d/%d %s" % (level_index, level_count, label))
    if repeats and repeats > 1:
        parts.append("repeat %d/%d" % (repeat or 1, repeats))
    parts.append("%s elapsed" % clock(elapsed_s))
    parts.append(eta.text())
    return SEP.join(parts)


_PART_NAME = re.compile(r"^(?P<sweep>.+)__c\d+(?:__r[0-9A-Za-z.+-]+)?(?:__rep\d+)?\.json$")


def sweep_stem(host: str, profile: str) -> str:
    """The part files' name prefix of one host's profile (results/parts.py's part_stem)."""
    return part_stem({"host": host, "profile": profile, "concurrency": 0})[:-len("__c0")]


def level_walls_from_parts(parts_dir: str, since: Optional[float] = None,
                           skip: Optional[str] = None) -> List[float]:
    """Wall times of the levels measured in this run, read from the part files' write times:
    within one host's profile a level's part is written one level's wall time (its warm-up,
    window, tail and drain) after the previous one's; the first level of a profile has no
    such mark and is left out. Parts older than `since` (kept from before a resume) and the
    sweep `skip` (a sweep_stem: the sweep that counts its own levels) are left out too."""
    groups = {}
    try:
        names = os.listdir(parts_dir)
    except OSError:
        return []
    for name in names:
        match = _PART_NAME.match(name)
        if match is None or name.startswith(".") or match.group("sweep") == skip:
            continue
        try:
            mtime = os.stat(os.path.join(parts_dir, name)).st_mtime
        except OSError:
            continue
        if since is not None and mtime < since:
            continue
        groups.setdefault(match.group("sweep"), []).append(mtime)
    walls = []
    for times in groups.values():
        times.sort()
        walls.extend(b - a for a, b in zip(times, times[1:]))
    return walls


# -- the heartbeat's log line ------------------------------------------------------------------

def last_log_line(path: str, since: Optional[float] = None, secrets: Iterable[str] = (),
                  rules: redact.Rules = redact.DEFAULT_RULES, tail_bytes: int = 16384,
                  limit: int = LOG_LINE_MAX) -> Optional[str]:
    """The last non-empty line of a server's log, masked by redact.py's rules (and the given
    secret values); None when the file is unreadable, empty, or older than `since` (the previous
    start's log, before the launcher rotates it)."""
    try:
        with open(path, "rb") as fh:
            if since is not None and os.fstat(fh.fileno()).st_mtime < since:
                return None
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - tail_bytes))
            data = fh.read(tail_bytes)
    except OSError:
        return None
    text = data.decode("utf-8", errors="replace")
    lines = [line.strip() for line in re.split(r"[\r\n]+", text)]
    lines = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line) for line in lines if line]
    lines = [line for line in lines if line.strip()]
    if not lines:
        return None
    line = redact.redact_text(lines[-1], secrets, rules)
    return line if len(line) <= limit else line[:limit - 3] + "..."


# -- the end-of-run table ----------------------------------------------------------------------

def _row_notes(row: Mapping) -> str:
    return "; ".join(n for n in [level_verdict(row).note] + level_flags(row) if n)


def _numeric(name: str) -> bool:
    f = FIELD.get(name)
    return f is not None and f.kind != KIND_STR


def levels_table(rows: Sequence[Mapping]) -> List[str]:
    """An aligned text table of level rows: host, profile, C (and the rate of open-loop levels),
    then the cells of the live line's view (level_views: the same figures, the same digits), and
    the report's note on a level that has one. Numbers right-aligned."""
    if not rows:
        return []
    rate = any(r.get("load_mode") == LOAD_MODE_RATE for r in rows)
    cells = LAYOUTS[VIEW_LINE]
    repeated = any(row_repeat(r) > 1 for r in rows)
    headers = ["host", "profile", FIELD["concurrency"].header]
    right = [False, False, True]
    if rate:
        headers.append(FIELD["request_rate"].title)
        right.append(True)
    if repeated:
        headers.append(FIELD["repeat"].header)
        right.append(True)
    headers += [cell_header(cell) for cell in cells]
    right += [_numeric(cell.fields[0]) for cell in cells]
    notes = [_row_notes(r) for r in rows]
    if any(notes):
        headers.append("note")
        right.append(False)
    body = []
    for row, note in zip(rows, notes):
        line = [str(row.get("host", "?")), str(row.get("profile", "?")),
                format_value("concurrency", row.get("concurrency"))]
        if rate:
            line.append(format_value("request_rate", row.get("request_rate"))
                        if row.get("load_mode") == LOAD_MODE_RATE else "-")
        if repeated:
            line.append(format_value("repeat", row_repeat(row)))
        line += [cell_text(cell, row) for cell in cells]
        if any(notes):
            line.append(note)
        body.append(line)
    return Table(headers, body).to_text(right).split("\n")


def level_key(row: Mapping) -> tuple:
    """Which measurement a row is (level and repeat), for merging the rows of results and part
    files."""
    return (str(row.get("host")), str(row.get("profile")), level_label(row), row_repeat(row))


def heartbeat_line(host: str, profile: str, elapsed_s: float, log_line: Optional[str] = None) -> str:
    """'localhost eagle3: server starting, 00:45 elapsed | log: <its last line>'."""
    line = "%s %s: server starting, %s elapsed" % (host, profile, clock(elapsed_s))
    return line + (" | log: " + log_line if log_line else "")


# -- a level in progress -----------------------------------------------------------------------

def live_line(where: str, record) -> str:
    """'localhost/external C=4: 00:12 elapsed · window 8/20 s · 57 requests, 0 errors · 1234
    tok/s so far' from a level's live record (module_utils/loadgen/live.py's LiveRecord). The
    rate is the finished requests' output tokens over the time since the level started (warm-up
    included): a sign of life, not the level's figure, which comes at its end."""
    if record.phase == "window":
        phase = "window %.0f/%.0f s" % (record.window_s, record.level_seconds)
    elif record.phase == "tail":
        phase = "tail (window closed at %.0f s)" % record.window_s
    else:
        phase = "warm-up"
    errors = ", %d error%s" % (record.errors, "" if record.errors == 1 else "s")
    rate = record.tok_s
    parts = ["%s elapsed" % clock(record.elapsed_s), phase,
             "%d request%s%s" % (record.requests, "" if record.requests == 1 else "s",
                                 errors if record.errors else ""),
             "%s tok/s so far" % ("-" if rate is None else "%.0f" % rate)]
    return "%s: %s" % (where, SEP.join(parts))
