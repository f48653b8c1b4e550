"""A request's inter-token gaps in its record (requests.jsonl, the part files, requests.parquet):
the field `itl`, and `itl_basis`. Standard library only.

`itl` is text, one item per token-carrying chunk after the first, separated by single spaces:
the chunk's gap in integer microseconds since the previous token-carrying chunk, followed by
`x<k>` when it carried k tokens and k is not 1 (speculative decoding, chunked streams):

    "12003 11998 24010x2 12001"

The arrival times are rounded to the microsecond from the first chunk's, then differenced, so
the gaps add up to t_last - t_first to the microsecond (no drift over a long answer). "" for an
answer of one chunk; null (None) for a request without a token-carrying chunk.

`itl_basis` says what the counts mean: "token" - the server gave each chunk's token count
(the `x<k>`; none written means 1); "chunk" - it did not, and each gap is one sample, as the
level's ITL is then per chunk (levels.csv `itl_basis`). Null without a chunk.

Per token, as the level's ITL figures count it (loadgen/metrics.py itl_samples): a chunk of k
tokens that arrived g after the previous one is k samples of g/k (itl_samples below; a chunk
whose count is 0 gives none). Text, not a JSON list: ~6 bytes per token written and held (a
parsed list of ints holds ~36), both in the part files and in llm_bench's result, which carries
every record to the controller.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    ITL_BASIS_CHUNK, ITL_BASIS_TOKEN,
)

NS_PER_US = 1000


def encode(chunk_times: Optional[Sequence[int]],
           chunk_tokens: Optional[Sequence[int]] = None) -> Tuple[Optional[str], Optional[str]]:
    """(itl, itl_basis) of one request from its token-carrying chunks' arrival times (ns) and,
    when the server gave them, their token counts."""
    if not chunk_times:
        return None, None
    per_token = chunk_tokens is not None and len(chunk_tokens) == len(chunk_times)
    first = chunk_times[0]
    items = []
    previous = 0
    for i in range(1, len(chunk_times)):
        at = (chunk_times[i] - first + NS_PER_US // 2) // NS_PER_US
        gap = at - previous
        previous = at
        k = chunk_tokens[i] if per_token else 1
        items.append(str(gap) if k == 1 else "%dx%d" % (gap, k))
    return " ".join(items), ITL_BASIS_TOKEN if per_token else ITL_BASIS_CHUNK


def decode(itl: Optional[str]) -> List[Tuple[int, int]]:
    """[(gap_us, tokens)] of an `itl` text (tokens 1 where none is written); [] for null or "".
    Raises ValueError for text that is not one."""
    out = []
    for item in (itl or "").split():
        gap, _x, k = item.partition("x")
        out.append((int(gap), int(k) if k else 1))
    return out


def itl_samples_ms(itl: Optional[str], basis: Optional[str]) -> List[Tuple[float, float]]:
    """(value_ms, weight) ITL samples of one record, as the level's figures count them: per
    token (a k-token chunk gives gap/k with weight k; k = 0 gives none) on the token basis, one
    per chunk on the chunk basis."""
    out = []
    for gap, k in decode(itl):
        if basis == ITL_BASIS_CHUNK:
            out.append((gap / 1000.0, 1.0))
        elif k > 0:
            out.append((gap / 1000.0 / k, float(k)))
    return out
