"""What the report advises about speculation: the sentence SGLang's speculative profiles get, and
the vLLM speculation schedule (num_speculative_tokens_per_batch_size) to set from a crossover.
Split from analysis.py, which calls speculation_advice() from its recommendation."""

from __future__ import annotations

import json
import shlex

from ansible_collections.servelab.serving.plugins.module_utils.server.spec_schedule import (
    as_lists,
    build_schedule,
    speculation_max_batch,
)


# Said only when a speculative profile that may be recommended crosses below the baseline.
SPECULATION_SENTENCE = (
    " SGLang cannot switch speculation off above a concurrency, so pick the profile for the "
    "concurrency you expect to serve, or run both and route by load."
)


# vLLM's switch by load, read in the pinned release's own config (vllm/config/speculative.py and
# vllm/v1/spec_decode/dynamic/utils.py of vLLM 0.33.0): `disable_by_batch_size` is gone; a
# speculative config takes `num_speculative_tokens_per_batch_size`, inclusive batch-size ranges
# [[start, end, k], ...] from 1 upwards, k >= 0 (0: no speculation at that batch size); Model
# Runner V1 honours it only for ngram, eagle, eagle3, mtp, draft_model and dflash.
VLLM_SCHEDULE_RELEASE = "0.33.0"


VLLM_SCHEDULE_METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash")


VLLM_DEFAULT_MAX_NUM_SEQS = 256     # vLLM's default --max-num-seqs on GPUs of this class


# Said next to every schedule the report gives, because the measured profile ran without one:
# - vllm-project/vllm#49548 (open) reports this schedule collapsing throughput under load (the
#   speculation length flipping step to step; the simulator's spec_dynamic: thrash models it);
# - vLLM 0.33.0 forces cudagraph_mode PIECEWISE on Model Runner V1 whenever the schedule is set
#   (vllm/config/vllm.py:1069-1086, _maybe_override_dynamic_sd_cudagraph_mode), and drops the
#   schedule with data parallelism (:1110-1127); the schedule first exists in vLLM 0.24.0
#   (vllm/config/speculative.py:162; 0.23.0 has none). The simulator does not model the
#   PIECEWISE cost (plugins/module_utils/simulator/profiles.py, speculation_on).
VLLM_SCHEDULE_CAVEATS = (
    " Measure it before serving it: the open vllm-project/vllm#49548 reports this schedule collapsing "
    "under load, and vLLM 0.33.0 then runs CUDA graphs PIECEWISE instead of full on Model Runner V1 "
    "(vllm/config/vllm.py:1069-1086), a cost the measured profile did not pay and the simulator does "
    "not model.")


def _vllm_spec_config(cmdline: str | None) -> tuple[dict | None, int | None]:
    """The --speculative-config JSON and --max-num-seqs of a vLLM command line, where given."""
    config, max_seqs = None, None
    try:
        argv = shlex.split(cmdline or "")
    except ValueError:
        return None, None
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
        name = arg.split("=", 1)[0]
        if name == "--speculative-config":
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None
            config = parsed if isinstance(parsed, dict) else None
        elif name == "--max-num-seqs":
            try:
                max_seqs = int(value)
            except ValueError:
                pass
    return config, max_seqs


def vllm_schedule_setting(cross, record) -> str | None:
    """The exact speculative-config entry that turns speculation off above the measured
    crossover, for a vLLM profile (None when its command line has no speculative config).
    In a closed loop at concurrency C the running batch is about C, so speculation stays on for
    batch sizes up to the last concurrency where it still paid (the bracket's lower level, or the
    interpolated crossover rounded down when that lies higher)."""
    config, max_seqs = _vllm_spec_config(getattr(record, "cmdline", None))
    if not config or not config.get("num_speculative_tokens"):
        return None
    k = int(config["num_speculative_tokens"])
    keep = speculation_max_batch(cross.bracket[0] if cross.bracket else None,
                                 cross.concurrency, cross.estimate)
    top = max(max_seqs or VLLM_DEFAULT_MAX_NUM_SEQS, keep + 1)
    schedule = dict(config, num_speculative_tokens_per_batch_size=as_lists(
        build_schedule(keep, k, top)))
    text = (f" vLLM {VLLM_SCHEDULE_RELEASE} can switch {cross.profile}'s speculation off by load "
            f"(on {cross.host} it stops paying above C={keep}): --speculative-config "
            f"'{json.dumps(schedule, sort_keys=True, separators=(',', ':'))}'"
            " (a batch-size schedule: k tokens up to batch size "
            f"{keep}, none above; the running batch is about C in a closed loop"
            + ("" if max_seqs else f"; {top} stands for --max-num-seqs, vLLM's default here")
            + ")." + VLLM_SCHEDULE_CAVEATS)
    if str(config.get("method", "")).lower() not in VLLM_SCHEDULE_METHODS:
        text += (f" Its method {config.get('method')!r} honours the schedule only on Model "
                 "Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1).")
    return text


def speculation_advice(crossovers: list, speculative: set, failing: dict, records=()) -> str:
    """Per engine, how to act on a speculative profile's crossover: vLLM's exact schedule
    setting; SGLang (and the simulator, which models it) has no switch by load."""
    by_key = {(r.host, r.profile): r for r in records}
    wildcard = {r.profile: r for r in records if r.host == "*"}
    texts, sglang_like = [], False
    for cross in crossovers:
        key = (cross.host, cross.profile)
        if cross.status != "crossed" or key not in speculative or key in failing:
            continue
        record = by_key.get(key) or wildcard.get(cross.profile)
        engine = (getattr(record, "engine", None) or "").lower()
        setting = vllm_schedule_setting(cross, record) if engine == "vllm" else None
        if setting:
            texts.append(setting)
        else:
            sglang_like = True
    return (SPECULATION_SENTENCE if sglang_like else "") + "".join(texts)
