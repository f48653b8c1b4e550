"""What one request asks (Prompt) and the set of them a level sends (Workload). Standard library
only: shipped to the bench client with the load generator.

Every workload kind (workloads.py, datasets.py, generated.py, trace.py) builds these before the
level starts; the level turns each prompt into request bytes once, so nothing here is on the
load generator's timing path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

# How the input lengths a workload asked for were counted (the level row's `prompt_token_source`).
TOKENS_WORDS = "words"          # about one word per token; the server's count is in prompt_tokens
TOKENS_TEXT = "text"            # prompts as given (builtin, jsonl): no length was asked for
TOKENIZER_PREFIX = "tokenizer:"  # exact, counted by this tokenizer (the path follows)


class WorkloadError(ValueError):
    """Bad workload options: the message names the field and the fix."""


@dataclass
class Prompt:
    messages: List[Dict[str, str]]
    max_tokens: Optional[int] = None      # per-prompt override of the max_tokens option
    ignore_eos: bool = False
    label: str = ""
    # Content tokens of the prompt as the workload counted them (prompt_token_source says how);
    # None where no length was asked for. The chat template the server applies adds its own.
    input_tokens: Optional[int] = None

    @property
    def text(self) -> str:
        """Plain text for APIs without chat templates (/v1/completions, SGLang /generate)."""
        return "\n\n".join(m.get("content", "") for m in self.messages)


@dataclass
class Workload:
    kind: str
    prompts: List[Prompt] = field(default_factory=list)
    description: str = ""
    # How input lengths were counted: TOKENS_WORDS, TOKENS_TEXT or TOKENIZER_PREFIX + path.
    token_source: str = TOKENS_TEXT
    # Multi-turn: each conversation's turns, as indices into `prompts`, in the order they must be
    # sent (turn k's prompt carries turns 1..k-1 as history). Empty for single-turn workloads.
    conversations: List[List[int]] = field(default_factory=list)
    # Trace replay: each prompt's send time in seconds after the first (already scaled), in the
    # order of `prompts`. None for workloads without timestamps.
    arrivals_s: Optional[List[float]] = None
