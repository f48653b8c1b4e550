"""What a finished level's figures are good for: one verdict, for the sweep and for the report.

llm_bench stops a profile's sweep after a *failed* level (the server is not serving: going on
would only pile up errors), and bench_report leaves every level that is not *usable* out of the
speedup, the crossover and the recommendation. Both ask `level_verdict`, so a level that stops
the sweep is the level the report marks failed, for the same reason in the same words.

Rows come typed (a LevelRow as a dict, a part file, a module result) or from a frame (NaN where
a figure is missing); a field an older levels.csv lacks is simply not checked.
Standard library only.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.results.level_csv import as_bool
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    ITL_BASIS_CHUNK, STOP_SERVER_FAILING, TOKENS_SERVER,
)

USABLE = "usable"
FAILED = "failed"                   # the server did not serve this level: the sweep stops
CLIENT_LIMITED = "client_limited"   # the client, not the server, set the pace
EXCLUDED = "excluded"               # measured, but too many errors to draw conclusions from

DEFAULT_MAX_ERROR_RATE = 0.1
FIRST_ERROR_CHARS = 120             # of the first error's text quoted in a reason
# An optional `status` column (hand-made or older results) counts as ok with one of these.
OK_STATUSES = frozenset(("", "ok", "nan", "none", "finished", "success", "succeeded"))


@dataclass(frozen=True)
class LevelVerdict:
    status: str        # USABLE | FAILED | CLIENT_LIMITED | EXCLUDED
    reason: str = ""   # why it is not usable, in words a reader acts on

    @property
    def usable(self) -> bool:
        return self.status == USABLE

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    @property
    def note(self) -> str:
        """How tables and lines mark the level: '' when usable, 'failed: <reason>' when failed."""
        if self.failed:
            return "%s: %s" % (FAILED, self.reason)
        return self.reason


def _number(row: Mapping, name: str) -> Optional[float]:
    value = row.get(name)
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _text(row: Mapping, name: str) -> str:
    value = row.get(name)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value).strip()


def _first_error(row: Mapping) -> str:
    return _text(row, "first_error")[:FIRST_ERROR_CHARS]


# How servers word "this request field is not mine" in a 4xx body: transformers serve ("Unexpected
# fields in the request: {'ignore_eos'}"), pydantic's extra="forbid" (FastAPI: "extra_forbidden"
# with "loc": ["body", "ignore_eos"]), OpenAI ("Unrecognized request argument supplied: x") and
# serde ("unknown field `x`").
_REFUSED_PATTERNS = (
    re.compile(r"unexpected (?:fields?|keys?|arguments?)[^{\[]*[{\[]([^}\]]*)[}\]]", re.I),
    re.compile(r'extra_forbidden"[^}]*?"loc"\s*:\s*\[\s*"body"\s*,\s*"([A-Za-z_][\w.]*)"', re.I),
    re.compile(r'"loc"\s*:\s*\[\s*"body"\s*,\s*"([A-Za-z_][\w.]*)"[^}]*?extra_forbidden', re.I),
    re.compile(r"unrecognized request arguments? supplied:?\s*([\w, ]+)", re.I),
    re.compile(r"unknown (?:field|parameter|argument)s?:?\s*[`'\"]?([A-Za-z_]\w*)", re.I),
)
# The request fields servelab adds itself, and the setting that stops sending each.
_FIELD_SETTINGS = {
    "ignore_eos": "set bench_ignore_eos: false (llm_bench ignore_eos: false)",
    "continuous_usage_stats": "set bench_per_chunk_usage: false (llm_bench per_chunk_usage: false)",
}


def refused_fields(first_error: str) -> Tuple[str, ...]:
    """The request fields a 4xx answer says the server does not accept, in the order named."""
    match = re.match(r"\s*HTTP (4\d\d)\b", first_error or "")
    if not match:
        return ()
    names: List[str] = []
    for pattern in _REFUSED_PATTERNS:
        for found in pattern.findall(first_error):
            for name in re.split(r"[,\s]+", found):
                name = name.strip("'\"` ")
                if re.match(r"^[A-Za-z_][\w.]*$", name) and name not in names:
                    names.append(name)
    return tuple(names)


def refused_field_hint(first_error: str) -> str:
    """'the server refuses the request field ...: <what to set>' or '' (no field named)."""
    names = refused_fields(first_error)
    if not names:
        return ""
    fixes = [_FIELD_SETTINGS.get(n.split(".")[-1], "drop %s from bench_extra_body (llm_bench "
                                 "extra_body) or the workload" % n) for n in names]
    return "the server refuses the request field%s %s (not in its API): %s" % (
        "s" if len(names) > 1 else "", ", ".join(names), "; ".join(dict.fromkeys(fixes)))


def level_verdict(row: Mapping, max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> LevelVerdict:
    """The verdict on one level row; the first rule that applies decides."""
    status = _text(row, "status").lower()
    if status not in OK_STATUSES:
        return LevelVerdict(FAILED, "status %s" % status)
    run_requests, run_errors = _number(row, "run_requests"), _number(row, "run_errors")
    requests, errors = _number(row, "requests"), _number(row, "errors")
    first_error = _first_error(row)
    # A refused field fails every request alike: name it and the setting that drops it.
    hint = refused_field_hint(_text(row, "first_error"))
    hint = "; " + hint if hint else ""
    if run_requests and run_errors is not None and run_errors >= run_requests:
        return LevelVerdict(FAILED, "all %d requests failed%s%s" % (
            run_requests, " (first error: %s)" % first_error if first_error else "", hint))
    if _text(row, "stop_reason") == STOP_SERVER_FAILING:
        count = run_errors if run_errors is not None else (errors or 0)
        return LevelVerdict(FAILED, "the server kept failing (%d errors%s)%s" % (
            count, "; first: %s" % first_error if first_error else "", hint))
    # Both counts zero: not even the warmup finished (a window's requests are part of the run's).
    if run_requests == 0 and not requests:
        return LevelVerdict(FAILED, "no request finished (stop reason: %s)" % (
            _text(row, "stop_reason") or "not recorded"))
    tok_s = _number(row, "output_tok_s")
    if tok_s is None or tok_s <= 0:
        return LevelVerdict(FAILED, "no output measured" + (
            " (%s)" % first_error if first_error else "") + hint)
    if requests is not None and requests <= 0:
        return LevelVerdict(FAILED, "no request completed")
    if requests is not None and errors is not None and errors >= requests:
        return LevelVerdict(FAILED, "all %d requests errored" % requests)
    if as_bool(row.get("client_limited")):
        return LevelVerdict(CLIENT_LIMITED, "client-limited")
    if requests and errors is not None and errors / requests > max_error_rate:
        return LevelVerdict(EXCLUDED, "errors %.0f%% > %.0f%%" % (
            100 * errors / requests, 100 * max_error_rate))
    return LevelVerdict(USABLE)


# A level whose figures the host or the server may have set rather than the engine's speed: the
# bench client machine's CPU all but fully busy (host_cpu_util, over the window: a client sharing
# the machine with the server, or with other work, slows both), the server's KV cache all but
# full (memory pressure: requests queue or are preempted), a server that stopped sending.
HOST_SATURATED_CPU = 0.95
KV_PRESSURE = 0.95
STALLED_PREFIX = "stalled:"       # the load generator's words for a request stall_timeout ended


def _pressure_flags(row: Mapping) -> List[str]:
    """The host's and the server's limits the level ran into, each with its reason."""
    flags = []
    cpu = _number(row, "host_cpu_util")
    if cpu is not None and cpu >= HOST_SATURATED_CPU:
        flags.append("host saturated: the bench client machine's CPU was %.0f%% busy over the "
                     "window (>= %.0f%%): the host, not the engine, may have set these figures"
                     % (100 * cpu, 100 * HOST_SATURATED_CPU))
    kv = _number(row, "server_token_usage_mean")
    if kv is not None and kv >= KV_PRESSURE:
        flags.append("server memory pressure: its KV cache was %.0f%% full on average (>= %.0f%%):"
                     " requests queue or are preempted" % (100 * kv, 100 * KV_PRESSURE))
    first_error = _text(row, "first_error")
    running = _number(row, "server_running_reqs_mean")
    generated = _number(row, "server_generation_tokens_s")
    if first_error.startswith(STALLED_PREFIX):
        flags.append("server stalled: %s" % first_error[len(STALLED_PREFIX):].strip()[
            :FIRST_ERROR_CHARS])
    elif running is not None and running >= 1 and generated is not None and generated <= 0:
        flags.append("server stalled: %.1f requests running on average but no token generated "
                     "in the window (its /metrics)" % running)
    return flags


# Open loop: an achieved rate below this fraction of the rate asked for is said, with its cause.
RATE_SHORTFALL = 0.95
# Open loop: a send lateness p99 from here on means the client sent late (loadgen/honesty.py
# warns about it); under it, every arrival left within a millisecond of its due time.
LATENESS_NOTE_MS = 1.0


IN_FLIGHT_CAP = "in-flight cap: "     # open_loop_flag's words when the cap was the limit


def open_loop_flag(row: Mapping) -> str:
    """Why an open-loop level sent fewer requests than asked, '' when it did not fall short.

    The cap on requests in flight (`concurrency` in rate mode) allows at most cap / latency
    requests per second (Little's law, with the window's e2e p50): when that is below the rate
    asked for, the cap was the limit and the send lateness is arrivals queued behind it (4.70 of
    6 req/s with the cap of 8 in flight at 1.7 s per request).

    Otherwise the arrivals the schedule drew decide: a window of a few dozen Poisson arrivals
    holds fewer (or more) than rate x length by chance, and its edges cut the draw. Where the
    window sent what the schedule drew for it (`scheduled_requests`, the arrivals due in the
    window, within one request or 5 %), nothing fell short of the schedule: no flag. The send
    lateness is read first, though: `scheduled_requests` counts the arrivals due in the window
    that were sent (in it or after it), so an arrival a late client never sent is in neither
    count, and only the lateness of the ones it sent can show it. The client sent late when its
    p99 is at least LATENESS_NOTE_MS; under it every arrival left within a millisecond of its due
    time, and the shortfall is the draw's."""
    if _text(row, "load_mode") != "rate":
        return ""
    asked, got = _number(row, "request_rate"), _number(row, "arrival_rate_s")
    cap, e2e_ms = _number(row, "concurrency"), _number(row, "e2e_p50_ms")
    if not asked or got is None or got >= RATE_SHORTFALL * asked:
        return ""
    shortfall = "%.2f of %g req/s achieved" % (got, asked)
    allows = cap / (e2e_ms / 1000.0) if cap and e2e_ms else None
    if allows is not None and allows < asked:
        return (IN_FLIGHT_CAP + "%s with the cap of %d in flight (at e2e p50 %.2f s it allows "
                "about %.2f req/s; arrivals queued behind it, hence the send lateness): raise "
                "the cap (concurrency; bench_concurrency in rate mode) or lower the rate"
                % (shortfall, int(cap or 0), float(e2e_ms or 0) / 1000.0, float(allows)))
    drawn, held = _number(row, "scheduled_requests"), _number(row, "requests")
    late = _number(row, "send_lateness_p99_ms")
    client_late = late is not None and late >= LATENESS_NOTE_MS
    if not client_late and drawn is not None and held is not None and \
            held >= drawn - max(1.0, (1.0 - RATE_SHORTFALL) * drawn):
        return ""           # the window sent what the schedule drew for it: nothing fell short
    lateness = (" (send lateness p99 %s ms)" % ("%.0f" % late if late >= 10 else "%.2g" % late)
                if late is not None else "")
    drew = ("; %d arrivals were due in the window and %d requests were sent in it" % (drawn, held)
            if drawn is not None and held is not None else "")
    cap_words = ("%d in flight allow about %.2f req/s" % (int(cap or 0), float(allows))
                 if allows is not None else "no latency to tell")
    if late is None:
        return ("open loop behind: %s%s, not for the in-flight cap (%s); no send lateness was "
                "measured to tell whether the client sent late" % (shortfall, drew, cap_words))
    if client_late:
        return ("open loop behind: %s%s, not for the in-flight cap (%s): the client sent late%s; "
                "check client CPU and loop lag" % (shortfall, drew, cap_words, lateness))
    if drew:
        return ("open loop behind: %s%s, neither for the in-flight cap (%s) nor a late client%s"
                % (shortfall, drew, cap_words, lateness))
    return ("open loop: %.2f of %g req/s in this window: the arrivals drawn for it, sent on "
            "time%s" % (got, asked, lateness))


def level_flags(row: Mapping) -> List[str]:
    """Facts about a level a reader must know; they do not make it unusable."""
    flags = _pressure_flags(row)
    behind = open_loop_flag(row)
    if behind:
        flags.append(behind)
    complete = row.get("window_complete")
    if _text(row, "window_complete") and not as_bool(complete):
        reason = _text(row, "stop_reason")
        flags.append("window incomplete" + (" (%s)" % reason if reason else ""))
    if _text(row, "itl_basis") == ITL_BASIS_CHUNK:
        flags.append("ITL per chunk (tokens per chunk unknown)")
    source = _text(row, "tokens_source")
    if source and source != TOKENS_SERVER:
        flags.append("tokens counted by the client (%s)" % source)
    return flags
