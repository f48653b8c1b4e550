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

from itertools import compress, count, islice, repeat
from operator import ne, sub
from typing import List, Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    ITL_BASIS_CHUNK, ITL_BASIS_TOKEN,
)

NS_PER_US = 1000


def encode(chunk_times: Optional[Sequence[int]],
           chunk_tokens: Optional[Sequence[int]] = None) -> Tuple[Optional[str], Optional[str]]:
    """(itl, itl_basis) of one request from its token-carrying chunks' arrival times (ns) and,
    when the server gave them, their token counts.

    Every request of a level is encoded at the level's end, a firehose's 2000-token answers
    included, so the text is made in bulk: the gaps by one comprehension and one map, the text
    by one format of them all (about a fifth less CPU than a loop per chunk that appended each
    item, benchmarks/results/limit-itl-firehose-ab-2026-12-06.md)."""
    if not chunk_times:
        return None, None
    per_token = chunk_tokens is not None and len(chunk_tokens) == len(chunk_times)
    basis = ITL_BASIS_TOKEN if per_token else ITL_BASIS_CHUNK
    # (t - first + 500) // 1000 for every arrival (the first's is 0), differenced.
    first = chunk_times[0] - NS_PER_US // 2
    at = [(t - first) // NS_PER_US for t in chunk_times]
    gaps = tuple(map(sub, islice(at, 1, None), at))
    fields = ["%s"] * len(gaps)         # one format of the whole text: str() of each gap
    if per_token:
        # Only a chunk of k != 1 tokens is written "<gap>x<k>" (speculative decoding's).
        for i in compress(count(), map(ne, islice(chunk_tokens, 1, None), repeat(1))):
            fields[i] = "%%sx%d" % chunk_tokens[i + 1]
    return " ".join(fields) % gaps, basis


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
