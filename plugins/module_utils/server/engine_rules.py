"""What an SGLang release does with a combination of the serving flags a tuner searches: refuse it
at startup, fail on it while serving, rewrite it silently, or run it with a consequence worth
knowing. Read from each pinned release's own source (argdefs.py checks the flags' names the same
way), so a tuner refuses an impossible candidate before its first trial and knows which
candidates the engine turns into the same server.

    problems = check_sglang_flags("0.5.23", {"speculative_algorithm": "EAGLE3",
                                             "speculative_num_steps": 3,
                                             "speculative_eagle_topk": 1,
                                             "speculative_num_draft_tokens": 8})
    # -> [EngineRuleProblem(rule="topk1_draft_rewritten", severity="rewritten", ...,
    #      source="sglang/srt/arg_groups/speculative_hook.py:1260")]

Severities: `refused` (the engine raises or asserts before it serves), `runtime` (it starts and
fails on the first request that needs it), `rewritten` (it runs another value than the one
given: two candidates are one server), `note` (it runs it; the message says what that means).

Every rule names the line of each release it was read from (SGLANG_RULES[...].sources), and a
regular expression that finds that line (`witness`): tests/unit/test_server_engine_rules.py
opens the released wheels and fails when a recorded line no longer holds the rule. What the
pinned releases do NOT refuse, checked there too: a cuda_graph_max_bs below
max_running_requests is allowed everywhere (batches above it run eager), and
mem_fraction_static has no range check among the arguments (the pool's sizing fails instead).
Standard library only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.server.versions import (
    VersionError, parse_version,
)

SEVERITIES = ("refused", "runtime", "rewritten", "note")
# Releases whose source the rules were read from (roles/sglang/vars/releases.yml's sglang pins).
SGLANG_RULE_RELEASES = ("0.5.10", "0.5.13.post1", "0.5.14", "0.5.23")
# The algorithms these rules cover: EAGLE's handler (NEXTN is an alias of EAGLE).
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN")

FLAGS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
         "speculative_num_draft_tokens", "max_running_requests", "cuda_graph_max_bs",
         "chunked_prefill_size", "mem_fraction_static", "enable_mixed_chunk", "page_size")
FLAG_ALIASES = {"cuda_graph_max_bs_decode": "cuda_graph_max_bs"}

_SERVER_ARGS = "sglang/srt/server_args.py"
_SPEC_HOOK = "sglang/srt/arg_groups/speculative_hook.py"


class EngineRulesError(ValueError):
    """Bad input to check_sglang_flags: the message names the key and the fix."""


@dataclass(frozen=True)
class Witness:
    """How a test finds the rule's line in a release: the first line matching `pattern` in the
    first of `paths` that has one, after the first line matching `after` when given."""
    pattern: str
    paths: Tuple[str, ...]
    after: Optional[str] = None


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    flags: Tuple[str, ...]
    summary: str
    witness: Witness
    sources: Mapping[str, Optional[str]]   # release -> "path:line"; None: not in that release


@dataclass(frozen=True)
class EngineRuleProblem:
    rule: str
    severity: str
    flags: Tuple[str, ...]
    message: str
    source: str            # "path:line" in the release checked
    release: str           # the release whose source the rule was read from


SGLANG_RULES: Tuple[Rule, ...] = (
    Rule("max_running_positive", "refused", ("max_running_requests",),
         "max_running_requests must be >= 1 (the worker asserts it)",
         Witness(r'assert self(\.model_runner)?\.max_running_requests > 0, "max_running_request is zero"',
                 ("sglang/srt/managers/tp_worker.py",)),
         {"0.5.10": "sglang/srt/managers/tp_worker.py:296",
          "0.5.13.post1": "sglang/srt/managers/tp_worker.py:299",
          "0.5.14": "sglang/srt/managers/tp_worker.py:336",
          "0.5.23": "sglang/srt/managers/tp_worker.py:420"}),
    Rule("spec_shape_all_or_none", "refused",
         ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"),
         "without speculative_num_steps, topk and draft tokens must be unset too (the engine "
         "then chooses all three); it asserts otherwise",
         Witness(r"^\s+(cfg|server_args|self)\.speculative_eagle_topk is None$",
                 (_SPEC_HOOK, _SERVER_ARGS)),
         {"0.5.10": "sglang/srt/server_args.py:3055",
          "0.5.13.post1": "sglang/srt/arg_groups/speculative_hook.py:342",
          "0.5.14": "sglang/srt/arg_groups/speculative_hook.py:321",
          "0.5.23": "sglang/srt/arg_groups/speculative_hook.py:1161"}),
    Rule("topk1_draft_rewritten", "rewritten",
         ("speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_num_steps"),
         "with speculative_eagle_topk 1 the engine sets speculative_num_draft_tokens to "
         "speculative_num_steps + 1 (a chain), whatever was given",
         Witness(r"speculative_num_draft_tokens is adjusted to speculative_num_steps \+ 1",
                 (_SPEC_HOOK, _SERVER_ARGS)),
         {"0.5.10": "sglang/srt/server_args.py:3079",
          "0.5.13.post1": "sglang/srt/arg_groups/speculative_hook.py:369",
          "0.5.14": "sglang/srt/arg_groups/speculative_hook.py:388",
          "0.5.23": "sglang/srt/arg_groups/speculative_hook.py:1260"}),
    Rule("draft_tokens_within_tree", "runtime",
         ("speculative_num_draft_tokens", "speculative_eagle_topk", "speculative_num_steps"),
         "the verify tree keeps the best speculative_num_draft_tokens - 1 of the topk + "
         "(steps - 1) * topk^2 draft candidates (torch.topk): more fails on the first decode",
         Witness(r"torch\.topk\(score_list, num_draft_token - 1",
                 ("sglang/srt/speculative/eagle_utils.py",)),
         {"0.5.10": "sglang/srt/speculative/eagle_utils.py:27",
          "0.5.13.post1": "sglang/srt/speculative/eagle_utils.py:75",
          "0.5.14": "sglang/srt/speculative/eagle_utils.py:79",
          "0.5.23": "sglang/srt/speculative/eagle_utils.py:110"}),
    Rule("spec_max_running_default", "note", ("max_running_requests",),
         "with EAGLE speculation and no max_running_requests the engine runs 48",
         Witness(r"Max running requests is reset to 48", (_SPEC_HOOK, _SERVER_ARGS),
                 after=r'def _handle_eagle_family|if self\.speculative_algorithm in '
                       r'\("EAGLE", "EAGLE3", "STANDALONE"\):'),
         {"0.5.10": "sglang/srt/server_args.py:2996",
          "0.5.13.post1": "sglang/srt/arg_groups/speculative_hook.py:285",
          "0.5.14": "sglang/srt/arg_groups/speculative_hook.py:273",
          "0.5.23": "sglang/srt/arg_groups/speculative_hook.py:1093"}),
    Rule("mixed_chunk_off_with_eagle", "rewritten", ("enable_mixed_chunk",),
         "EAGLE speculation turns enable_mixed_chunk off",
         Witness(r'"eagle speculative decoding\."', (_SPEC_HOOK, _SERVER_ARGS)),
         {"0.5.10": "sglang/srt/server_args.py:3025",
          "0.5.13.post1": "sglang/srt/arg_groups/speculative_hook.py:310",
          "0.5.14": "sglang/srt/arg_groups/speculative_hook.py:286",
          # 0.5.23 keeps it: EAGLE and EAGLE3 support mixed chunks (speculative/spec_info.py:147-157)
          "0.5.23": None}),
    Rule("cuda_graph_eager_above", "note", ("cuda_graph_max_bs", "max_running_requests"),
         "a cuda_graph_max_bs below max_running_requests is allowed: decode batches above it run "
         "eager (slower steps), not refused",
         Witness(r"else cuda_graph_bs <= self\.max_bs",
                 ("sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
                  "sglang/srt/model_executor/cuda_graph_runner.py")),
         {"0.5.10": "sglang/srt/model_executor/cuda_graph_runner.py:686",
          "0.5.13.post1": "sglang/srt/model_executor/cuda_graph_runner.py:663",
          "0.5.14": "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py:420",
          "0.5.23": "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py:890"}),
    Rule("chunked_prefill_page_size", "refused", ("chunked_prefill_size", "page_size"),
         "chunked_prefill_size > 0 must be divisible by page_size (asserted)",
         Witness(r'"chunked_prefill_size must be divisible by page_size"',
                 ("sglang/srt/arg_groups/validation_hook.py", _SERVER_ARGS)),
         {"0.5.10": "sglang/srt/server_args.py:6111",
          "0.5.13.post1": "sglang/srt/server_args.py:7464",
          "0.5.14": "sglang/srt/server_args.py:6692",
          "0.5.23": "sglang/srt/arg_groups/validation_hook.py:245"}),
    Rule("chunked_prefill_off", "note", ("chunked_prefill_size",),
         "chunked_prefill_size <= 0 turns chunked prefill off (-1 is the documented value)",
         Witness(r"elif self\.chunked_prefill_size is not None and self\.chunked_prefill_size <= 0:",
                 ("sglang/srt/managers/scheduler.py",)),
         {"0.5.10": "sglang/srt/managers/scheduler.py:878",
          "0.5.13.post1": "sglang/srt/managers/scheduler.py:935",
          "0.5.14": "sglang/srt/managers/scheduler.py:994",
          "0.5.23": "sglang/srt/managers/scheduler.py:1372"}),
    Rule("mem_fraction_no_pool", "refused", ("mem_fraction_static",),
         "mem_fraction_static <= 0 leaves no KV pool: the engine stops with 'Not enough memory' "
         "(no range check among the arguments)",
         Witness(r"Not enough memory\. Please try to increase --mem-fraction-static\.",
                 ("sglang/srt/model_executor/pool_configurator.py",
                  "sglang/srt/model_executor/model_runner_kv_cache_mixin.py")),
         {"0.5.10": "sglang/srt/model_executor/model_runner_kv_cache_mixin.py:57",
          "0.5.13.post1": "sglang/srt/model_executor/pool_configurator.py:53",
          "0.5.14": "sglang/srt/model_executor/pool_configurator.py:58",
          "0.5.23": "sglang/srt/model_executor/pool_configurator.py:96"}),
    Rule("mem_fraction_whole_gpu", "refused", ("mem_fraction_static",),
         "mem_fraction_static is (weights + KV pool) / GPU memory: >= 1 leaves nothing for "
         "activations and CUDA graphs",
         Witness(r"The argument mem_fraction_static is defined as \(model weights \+ KV cache pool\)",
                 ("sglang/srt/arg_groups/memory_hook.py", _SERVER_ARGS)),
         {"0.5.10": "sglang/srt/server_args.py:1154",
          "0.5.13.post1": "sglang/srt/server_args.py:1457",
          "0.5.14": "sglang/srt/server_args.py:3135",
          "0.5.23": "sglang/srt/arg_groups/memory_hook.py:60"}),
)
_RULES = {r.id: r for r in SGLANG_RULES}


def locate(witness: Witness, read: Callable[[str], Optional[str]]) -> Optional[str]:
    """"path:line" of the witness in a release whose files `read(path)` returns (None: absent)."""
    pattern = re.compile(witness.pattern)
    after = re.compile(witness.after) if witness.after else None
    for path in witness.paths:
        text = read(path)
        if text is None:
            continue
        armed = after is None
        for number, line in enumerate(text.splitlines(), 1):
            if not armed:
                armed = bool(after.search(line))
                continue
            if pattern.search(line):
                return f"{path}:{number}"
    return None


def rules_release(release: str) -> Tuple[str, List[str]]:
    """(the checked release whose rules apply, notes): the release itself, or the newest checked
    one before it (rules change with releases; a newer one is read as the newest we checked)."""
    try:
        wanted = parse_version(release)
    except VersionError as exc:
        raise EngineRulesError(f"release: {exc}") from None
    known = sorted(SGLANG_RULE_RELEASES, key=lambda v: parse_version(v).release)
    if release in known:
        return release, []
    older = [v for v in known if wanted.at_least(parse_version(v).release)]
    chosen = older[-1] if older else known[0]
    return chosen, [f"SGLang {release}: rules read from {chosen}, the nearest release checked "
                    f"({', '.join(known)})"]


def _flags(flags: Mapping[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for raw, value in flags.items():
        name = str(raw).lstrip("-").replace("-", "_")
        name = FLAG_ALIASES.get(name, name)
        if name not in FLAGS:
            raise EngineRulesError(f"{raw}: not a flag these rules read; known: {', '.join(FLAGS)}")
        if value is None:
            continue
        if name == "speculative_algorithm":
            out[name] = str(value).upper()
        elif name == "enable_mixed_chunk":
            if not isinstance(value, bool):
                raise EngineRulesError(f"{raw} must be true or false (got {value!r})")
            out[name] = value
        elif name == "mem_fraction_static":
            try:
                out[name] = float(value)
            except (TypeError, ValueError):
                raise EngineRulesError(f"{raw} must be a number (got {value!r})") from None
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise EngineRulesError(f"{raw} must be an integer (got {value!r})")
            out[name] = value
    return out


def check_sglang_flags(release: str, flags: Mapping[str, Any]) -> List[EngineRuleProblem]:
    """Every rule of `release` these flag values meet (SGLang's ServerArgs names; dashes, a
    leading `--` and `cuda_graph_max_bs_decode` accepted; None = not given). Empty: the release
    runs them as given."""
    used, notes = rules_release(release)
    f = _flags(flags)
    out: List[EngineRuleProblem] = []

    def hit(rule_id: str, message: str) -> None:
        rule = _RULES[rule_id]
        source = rule.sources.get(used)
        if source is None:
            return                                   # this release has no such rule
        out.append(EngineRuleProblem(rule.id, rule.severity, rule.flags, message, source, used))

    running = f.get("max_running_requests")
    if running is not None and running < 1:
        hit("max_running_positive", f"max_running_requests {running}: must be >= 1")
    eagle = f.get("speculative_algorithm") in EAGLE_FAMILY
    steps = f.get("speculative_num_steps")
    topk = f.get("speculative_eagle_topk")
    draft = f.get("speculative_num_draft_tokens")
    if eagle:
        if steps is None and (topk is not None or draft is not None):
            hit("spec_shape_all_or_none",
                "speculative_eagle_topk / speculative_num_draft_tokens set without "
                "speculative_num_steps: set all three, or none")
        if steps is not None and topk == 1 and draft is not None and draft != steps + 1:
            hit("topk1_draft_rewritten",
                f"speculative_eagle_topk 1: speculative_num_draft_tokens {draft} becomes "
                f"{steps + 1} (speculative_num_steps + 1)")
        if steps is not None and topk is not None and topk > 1 and draft is not None:
            candidates = topk + (steps - 1) * topk * topk
            if draft - 1 > candidates:
                hit("draft_tokens_within_tree",
                    f"speculative_num_draft_tokens {draft} needs {draft - 1} draft tokens but topk "
                    f"{topk} over {steps} steps gives {candidates} candidates")
        if running is None:
            hit("spec_max_running_default",
                "max_running_requests not set: the engine runs 48 with EAGLE speculation")
        if f.get("enable_mixed_chunk"):
            hit("mixed_chunk_off_with_eagle",
                "enable_mixed_chunk true becomes false with EAGLE speculation")
    graph = f.get("cuda_graph_max_bs")
    cap = running if running is not None else (48 if eagle else None)
    if graph is not None and cap is not None and graph < cap:
        hit("cuda_graph_eager_above",
            f"cuda_graph_max_bs {graph} < max_running_requests {cap}: decode batches of "
            f"{graph + 1}-{cap} run eager")
    chunk = f.get("chunked_prefill_size")
    page = f.get("page_size", 1)
    if chunk is not None and chunk > 0 and page > 0 and chunk % page:
        hit("chunked_prefill_page_size",
            f"chunked_prefill_size {chunk} is not a multiple of page_size {page}")
    if chunk is not None and chunk <= 0 and chunk != -1:
        hit("chunked_prefill_off", f"chunked_prefill_size {chunk} turns chunked prefill off, as -1")
    mem = f.get("mem_fraction_static")
    if mem is not None and mem <= 0:
        hit("mem_fraction_no_pool", f"mem_fraction_static {mem}: no memory for the KV pool")
    if mem is not None and mem >= 1:
        hit("mem_fraction_whole_gpu", f"mem_fraction_static {mem}: must be below 1")
    for note in notes:
        out.append(EngineRuleProblem("nearest_release", "note", (), note, "", used))
    return out


def refused(problems: List[EngineRuleProblem]) -> List[EngineRuleProblem]:
    """The problems that make a candidate impossible (refused before serving, or failing on it)."""
    return [p for p in problems if p.severity in ("refused", "runtime")]
