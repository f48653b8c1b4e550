"""What the server's log says it did with the features it was asked for.

A flag is not proof: SGLang accepts `--flashinfer-allreduce-fusion-backend auto` and then, on a GPU
or driver it cannot use, logs "Skipping allreduce fusion" and runs without it. The figures would
then be filed under a feature that never ran. The patterns below are the engines' real log
strings (read from SGLang 0.5.10-0.5.23's flashinfer_comm_fusion.py, torch_symm_mem.py,
server_args.py / arg_groups); they are data, so a new release's wording is one line here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, List, Tuple

SCAN_BYTES = 32 * 1024 * 1024   # features are decided at start-up: the head of the log suffices
MAX_LINE = 300


@dataclass(frozen=True)
class LogPattern:
    feature: str
    kind: str            # "skipped": a feature did not run; "adjusted": the engine changed a setting
    regex: str
    engines: Tuple[str, ...] = ("sglang",)


LOG_PATTERNS: Tuple[LogPattern, ...] = (
    LogPattern("flashinfer_allreduce_fusion", "skipped", r"Skipping allreduce fusion"),
    LogPattern("flashinfer_allreduce_fusion", "skipped",
               r"Disabling flashinfer allreduce fusion permanently"),
    LogPattern("flashinfer_allreduce_fusion", "skipped",
               r"FlashInfer allreduce fusion disabled globally"),
    LogPattern("flashinfer_allreduce_fusion", "skipped", r"FlashInfer AllReduce fusion disabled"),
    LogPattern("flashinfer_allreduce_fusion", "skipped",
               r"flashinfer\.comm (?:unified )?(?:allreduce_fusion API )?is not available"),
    LogPattern("flashinfer_allreduce_fusion", "skipped",
               r"FlashInfer comm not available, skipping workspace initialization"),
    LogPattern("flashinfer_allreduce_fusion", "skipped",
               r"FlashInfer allreduce fusion is forcibly disabled"),
    LogPattern("flashinfer_allreduce_fusion", "skipped",
               r"Disable --(?:enable-flashinfer-allreduce-fusion|flashinfer-allreduce-fusion-backend)"
               r" because deterministic inference"),
    LogPattern("torch_symm_mem", "skipped",
               r"TorchSymmMemCommunicator: (?:Device capability|World size) \S+ not supported"),
    LogPattern("torch_symm_mem", "skipped",
               r"torch symmetric memory multicast operations are not supported"),
    LogPattern("spec_v2", "skipped", r"Non-overlap \(synchronous\) spec v2 is used"),
    LogPattern("speculative", "adjusted",
               r"speculative_num_draft_tokens is adjusted to speculative_num_steps \+ 1"),
    LogPattern("max_running_requests", "adjusted",
               r"Max running requests is reset to \d+ for speculative decoding"),
)
_COMPILED = [(p, re.compile(p.regex)) for p in LOG_PATTERNS]


@dataclass
class LogFindings:
    features_skipped: List[str]
    engine_adjustments: List[str]


def scan_lines(lines: Iterable[str], engine: str,
               patterns=tuple(_COMPILED)) -> LogFindings:
    """One entry per pattern that matched: "<feature>: <first matching line> (xN)". TP ranks log
    the same line each; the count says how many did."""
    hits = {}
    order = []
    for line in lines:
        for pattern, regex in patterns:
            if engine not in pattern.engines or not regex.search(line):
                continue
            if pattern.regex not in hits:
                hits[pattern.regex] = [pattern, line.strip()[:MAX_LINE], 0]
                order.append(pattern.regex)
            hits[pattern.regex][2] += 1
    skipped, adjusted = [], []
    for key in order:
        pattern, line, count = hits[key]
        entry = f"{pattern.feature}: {line}" + (f" (x{count})" if count > 1 else "")
        (skipped if pattern.kind == "skipped" else adjusted).append(entry)
    return LogFindings(features_skipped=skipped, engine_adjustments=adjusted)


def scan_log(path: str, engine: str) -> LogFindings:
    try:
        with open(path, "rb") as fh:
            text = fh.read(SCAN_BYTES).decode("utf-8", "replace")
    except OSError:
        return LogFindings([], [])
    return scan_lines(text.splitlines(), engine)
