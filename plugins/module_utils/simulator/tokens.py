"""Token rules: how prompt text counts as tokens, what generated tokens look like, and the
seeded uniform draw every other draw is built on. Standard library only."""
from __future__ import annotations

import hashlib
import math
import statistics
from typing import Any

from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    BYTES_PER_TOKEN, SimError, SimProfile,
)


def prompt_tokens_for_text(text: str) -> int:
    """The documented rule: ceil(utf8 bytes / 4), at least 1."""
    return max(1, -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN))


def text_for_prompt_tokens(n: int, seed: int = 0) -> str:
    """An ASCII text that the rule above counts as exactly n tokens (for load generators)."""
    if n < 1:
        raise SimError(f"prompt tokens must be >= 1 (got {n})")
    return token_text(seed, n)


def _hash_unit(*parts: Any) -> float:
    """Deterministic uniform in (0, 1) from the parts."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return (int.from_bytes(h, "big") + 0.5) / 2.0 ** 64


def natural_output_tokens(p: SimProfile, content_key: str, seed: int) -> int:
    """Length the model would stop at by itself: log-normal, seeded by the prompt's hash."""
    z = statistics.NormalDist().inv_cdf(_hash_unit("len", seed, content_key))
    return max(1, int(round(p.natural_len_median * math.exp(p.natural_len_sigma * z))))


# 64 four-byte tokens: plain ASCII, nothing to escape in JSON.
_VOCAB = [" " + c + v + e for c in "bcdfgklmnprstvwz" for v, e in ("an", "el", "ir", "os")]
_VOCAB_TEXT = "".join(_VOCAB) * 3


def token_text(start: int, k: int) -> str:
    """Text of k consecutive generated tokens beginning at token position `start`."""
    i = (start % 64) * BYTES_PER_TOKEN
    if k <= 64:
        return _VOCAB_TEXT[i:i + k * BYTES_PER_TOKEN]
    return "".join(token_text(start + j, min(64, k - j)) for j in range(0, k, 64))
