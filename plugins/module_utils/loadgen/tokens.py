"""Counting prompt tokens: an optional tokenizer (workload.tokenizer) for exact input lengths,
else about one word per token. Standard library only; the tokenizer packages are imported only
when a tokenizer is asked for, on the bench client, before the level starts.

- a `tokenizer.json` file (or a directory holding one) is read with the `tokenizers` package;
- any other directory is a transformers tokenizer (`AutoTokenizer.from_pretrained`, local files
  only: nothing is fetched from the hub).
Token counts are of the prompt's content (no special tokens): the chat template a server applies
adds its own, which the server's `prompt_tokens` include.
"""
from __future__ import annotations

import os
import random
from typing import List, Optional, Sequence

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.prompts import (
    TOKENIZER_PREFIX, TOKENS_WORDS, WorkloadError,
)

# Tries to land a decoded text on an exact token count (a decode-encode round trip can merge or
# split tokens at the edges; each try corrects by the difference).
_EXACT_TRIES = 8


class Counter:
    """Counts and builds text by tokens. This base counts words (one token each, roughly)."""

    source = TOKENS_WORDS
    exact = False

    def count(self, text: str) -> int:
        return len(text.split())

    def encode(self, text: str) -> List[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError


class Words(Counter):
    """The approximation every workload used before tokenizers: a word is about one token."""


class Tokenizer(Counter):
    """A real tokenizer behind encode/decode (the `tokenizers` or transformers object)."""

    exact = True

    def __init__(self, path: str, encode, decode):
        self.path = path
        self.source = TOKENIZER_PREFIX + path
        self._encode = encode
        self._decode = decode

    def encode(self, text: str) -> List[int]:
        return list(self._encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self._decode(list(ids))

    def count(self, text: str) -> int:
        return len(self.encode(text))


def _missing(variable: str, path: str, package: str) -> WorkloadError:
    return WorkloadError("%s %r: reading it needs the `%s` package on the bench client, which is "
                         "not installed: pip install %s (or drop %s to count words)"
                         % (variable, path, package, package, variable))


def load_tokenizer(path: Optional[str], variable: str = "workload.tokenizer") -> Counter:
    """The counter for `path`: Words() when none is given, else the tokenizer found there."""
    if not path:
        return Words()
    path = os.path.expanduser(str(path))
    if not os.path.exists(path):
        raise WorkloadError("%s %r: no such file or directory on the bench client (give a local "
                            "tokenizer.json, or a directory with a transformers tokenizer)"
                            % (variable, path))
    json_file = path if os.path.isfile(path) else os.path.join(path, "tokenizer.json")
    if os.path.isfile(json_file):
        try:
            import tokenizers  # noqa: F401 - optional dependency
        except ImportError:
            if os.path.isfile(path):
                raise _missing(variable, path, "tokenizers") from None
        else:
            try:
                tok = tokenizers.Tokenizer.from_file(json_file)
            except Exception as exc:  # the package's own error types vary by version
                raise WorkloadError("%s %r: not a tokenizer.json the tokenizers package reads "
                                    "(%s)" % (variable, json_file, exc)) from None
            return Tokenizer(path, lambda text: tok.encode(text, add_special_tokens=False).ids,
                             lambda ids: tok.decode(ids, skip_special_tokens=True))
    try:
        import transformers  # noqa: F401 - optional dependency
    except ImportError:
        raise _missing(variable, path, "transformers") from None
    try:
        tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # OSError, ValueError, ...: whatever transformers raises
        raise WorkloadError("%s %r: transformers cannot load a tokenizer from it (%s)"
                            % (variable, path, exc)) from None
    return Tokenizer(path, lambda text: tok.encode(text, add_special_tokens=False),
                     lambda ids: tok.decode(ids, skip_special_tokens=True))


def filler_text(counter: Counter, n: int, rng: random.Random, words: Sequence[str],
                head: str = "") -> tuple:
    """(text, tokens): text of `n` tokens made of `words`, starting with `head` (a distinct
    number keeps prefix caching from serving one prompt from another). With a tokenizer the
    count is exact (or as near as the tokenizer's round trip allows, and then the count is the
    true one); with words, n words (the head counted as one)."""
    parts = [head] if head else []
    if not counter.exact:
        parts.extend(rng.choice(words) for _word in range(max(0, n - len(parts))))
        text = " ".join(parts)
        return text, n
    parts.extend(rng.choice(words) for _word in range(n + 8))
    ids = counter.encode(" ".join(parts))[:n]
    text = counter.decode(ids)
    for _try in range(_EXACT_TRIES):
        # Count what the server will see: the decoded text, encoded again.
        ids = counter.encode(text)
        if len(ids) == n:
            break
        if len(ids) > n:
            ids = ids[:n]
        else:
            more = " " + " ".join(rng.choice(words) for _w in range(n - len(ids)))
            ids = ids + counter.encode(more)[:n - len(ids)]
        text = counter.decode(ids)
    return text, counter.count(text)
