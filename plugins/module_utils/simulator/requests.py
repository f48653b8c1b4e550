"""One generation request: its parsing (OpenAI and SGLang bodies), its record (SimRequest)
and its seeded draws (overhead share, accepted lengths). Standard library only."""
from __future__ import annotations

import json
import random
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    DEFAULT_GENERATE_MAX_NEW_TOKENS, DEFAULT_OPENAI_MAX_TOKENS, SimProfile,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.tokens import (
    _hash_unit, prompt_tokens_for_text,
)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def overhead_factor(p: SimProfile, seed: int, index: Any) -> float:
    """This request's share of request_overhead_ms: uniform in 1 +- jitter, seeded by arrival."""
    if not p.request_overhead_jitter:
        return 1.0
    return 1.0 + p.request_overhead_jitter * (2.0 * _hash_unit("overhead", seed, index) - 1.0)


class _Draws:
    """Seeded accepted-length draws for one request (deterministic per seed and request id)."""
    __slots__ = ("_rng", "_cdf")

    def __init__(self, seed: int, key: Any, cdf: List[float]):
        self._rng = random.Random(f"{seed}:{key}")
        self._cdf = cdf

    def next(self) -> int:
        u = self._rng.random()
        for k, c in enumerate(self._cdf, 1):
            if u < c:
                return k
        return len(self._cdf)


class _Fail(Exception):
    def __init__(self, status: int, message: str, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.message, self.err_type = status, message, err_type


class SimRequest:
    """One generation request and everything the stream and the truth record need."""
    __slots__ = ("id", "index", "api", "stream", "include_usage", "continuous_usage",
                 "prompt_tokens", "target",
                 "finish_reason", "proto", "t_recv_ns", "emitted", "chunk_ns", "chunk_tokens",
                 "t_first_ns", "t_last_ns", "error", "pieces", "text_seed", "fail_at",
                 "stall_at", "stall_until", "malformed_at", "malformed", "finished", "cancelled",
                 "internal", "future", "created", "prefix", "suffix", "verify_ct", "draws",
                 "t_admit_ns", "t_arrive_ns", "prefill_left")

    def __init__(self):
        self.emitted = 0
        self.chunk_ns: List[int] = []
        self.chunk_tokens: List[int] = []
        self.t_first_ns = self.t_last_ns = None
        self.error = None
        self.pieces: List[str] = []
        self.fail_at = self.stall_at = self.malformed_at = 0
        self.stall_until = 0.0
        self.malformed = 0
        self.finished = self.cancelled = self.internal = False
        self.t_admit_ns = None
        self.prefill_left = 0          # prompt tokens still to prefill once admitted
        self.t_arrive_ns: Optional[int] = None   # kernel receive stamp; None: the read time
        self.future = None
        self.proto = None
        self.verify_ct = 0
        self.draws = None
        self.include_usage = False
        self.continuous_usage = False   # stream_options.continuous_usage_stats (vLLM/SGLang)


def _error_obj(status: int, message: str, err_type: Optional[str] = None) -> Dict[str, Any]:
    err_type = err_type or ("BadRequestError" if status < 500 else "InternalServerError")
    return {"object": "error", "error": {"message": message, "type": err_type, "code": status},
            "message": message, "code": status}


# --- request parsing ------------------------------------------------------------------------------
def _int_field(data: Mapping[str, Any], name: str, default: Optional[int], minimum: int) -> int:
    value = data.get(name, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _Fail(400, f"{name} must be an integer >= {minimum} (got {value!r})")
    return value


def _bool_field(data: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = data.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _Fail(400, f"{name} must be true or false (got {value!r})")
    return value


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise _Fail(400, f"{where} must be a string or a list of text parts")


def _parse_openai(api: str, data: Mapping[str, Any]):
    stream = _bool_field(data, "stream")
    if data.get("n", 1) not in (1, None):
        raise _Fail(400, "n must be 1 (the simulator returns one choice)")
    max_tokens = data.get("max_tokens")
    if max_tokens is None and api == "chat":
        max_tokens = data.get("max_completion_tokens")
    max_tokens = _int_field({"max_tokens": max_tokens}, "max_tokens",
                            DEFAULT_OPENAI_MAX_TOKENS, 1)
    min_tokens = _int_field(data, "min_tokens", 0, 0)
    ignore_eos = _bool_field(data, "ignore_eos")
    opts = data.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise _Fail(400, "stream_options must be an object, e.g. {\"include_usage\": true}")
    include_usage = _bool_field(opts, "include_usage")
    # continuous_usage_stats: every content chunk carries the cumulative usage, so a client
    # knows how many tokens each (multi-token, speculative) chunk holds. 2 = final + per chunk.
    if _bool_field(opts, "continuous_usage_stats"):
        include_usage = 2 if include_usage else 3
    if api == "chat":
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) for m in messages):
            raise _Fail(400, "messages must be a non-empty list of {role, content} objects")
        text = "".join(_content_text(m.get("content"), f"messages[{i}].content")
                       for i, m in enumerate(messages))
        ptoks = prompt_tokens_for_text(text)
        key = _dumps([[m.get("role"), _content_text(m.get("content"), "content")]
                      for m in messages])
    else:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ptoks, key = prompt_tokens_for_text(prompt), prompt
        elif isinstance(prompt, list) and prompt and all(
                isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            ptoks, key = len(prompt), _dumps(prompt)
        else:
            raise _Fail(400, "prompt must be a string or a list of token ids (one prompt per "
                             "request)")
    return stream, max_tokens, min_tokens, ignore_eos, ptoks, key, include_usage


def _parse_generate(data: Mapping[str, Any]):
    sp = data.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise _Fail(400, "sampling_params must be an object, e.g. {\"max_new_tokens\": 128}")
    stream = _bool_field(data, "stream")
    text, ids = data.get("text"), data.get("input_ids")
    if isinstance(text, str):
        ptoks, key = prompt_tokens_for_text(text), text
    elif isinstance(ids, list) and ids and all(
            isinstance(x, int) and not isinstance(x, bool) for x in ids):
        ptoks, key = len(ids), _dumps(ids)
    else:
        raise _Fail(400, "give \"text\" (a string) or \"input_ids\" (a list of ints); batches "
                         "(lists of prompts) are not supported by the simulator")
    max_tokens = _int_field(sp, "max_new_tokens", DEFAULT_GENERATE_MAX_NEW_TOKENS, 1)
    min_tokens = _int_field(sp, "min_new_tokens", 0, 0)
    ignore_eos = _bool_field(sp, "ignore_eos")
    rid = data.get("rid")
    if rid is not None and (not isinstance(rid, str) or not rid or any(
            c in rid for c in '"\\\r\n')):
        raise _Fail(400, "rid must be a plain non-empty string")
    return "generate", stream, max_tokens, min_tokens, ignore_eos, ptoks, key, rid
