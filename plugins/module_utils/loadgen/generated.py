"""Generated prompt sets beyond `synthetic`: shared-prefix groups (SGLang bench_serving's
generated-shared-prefix) and multi-turn conversations. Standard library only.

- shared_prefix: `groups` system prefixes of `prefix_tokens` each, and `prompts_per_group`
  questions of `question_tokens` per group: a server with prefix caching computes each prefix
  once per group. Each prefix starts with its own number, so groups share nothing.
- multi_turn: conversations whose turns are sent in order, turn k's request carrying turns
  1..k-1 (the user turns and the answers) as chat history. The answers in the history are the
  conversation's own (a ShareGPT file) or generated text of `output_tokens`: request bodies are
  built before the level starts (nothing is encoded on the timing path), so the history is the
  reference answer, not the one the server just gave; its length is the one asked for (with
  ignore_eos, the server's answer has that length too).
"""
from __future__ import annotations

import random
from typing import List, Optional

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.datasets import (
    data_files, read_rows, resolve, turns,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.prompts import (
    Prompt, Workload, WorkloadError,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.tokens import (
    Counter, filler_text,
)


def shared_prefix(counter: Counter, words, groups: int, prompts_per_group: int,
                  prefix_tokens: int, question_tokens: int, output_tokens: int, seed: int = 1,
                  ignore_eos: bool = True) -> Workload:
    rng = random.Random(seed)
    prompts = []
    for g in range(groups):
        prefix, _n = filler_text(counter, prefix_tokens, rng, words, head="%06d" % rng.randrange(10 ** 6))
        for q in range(prompts_per_group):
            question, n_q = filler_text(counter, question_tokens, rng, words,
                                        head="%06d" % rng.randrange(10 ** 6))
            prompts.append(Prompt(messages=[{"role": "system", "content": prefix},
                                            {"role": "user", "content": question}],
                                  max_tokens=output_tokens, ignore_eos=ignore_eos,
                                  label="prefix-%d-q%d" % (g, q),
                                  input_tokens=_n + n_q))
    return Workload("shared_prefix", prompts,
                    "%d groups x %d prompts, shared prefix of %d tokens, questions of %d, %d out"
                    % (groups, prompts_per_group, prefix_tokens, question_tokens, output_tokens),
                    token_source=counter.source)


def _conversation_prompts(label: str, messages: List[dict], counter: Counter,
                          output_tokens: Optional[int], max_turns: Optional[int],
                          ignore_eos: bool) -> List[Prompt]:
    """One prompt per user turn that has an answer: the history so far, then that turn."""
    out: List[Prompt] = []
    for i, m in enumerate(messages):
        if m["role"] != "user" or i + 1 >= len(messages) or messages[i + 1]["role"] != "assistant":
            continue
        answer = messages[i + 1]["content"]
        history = messages[:i + 1]
        out.append(Prompt(messages=[dict(x) for x in history],
                          max_tokens=output_tokens or max(1, counter.count(answer)),
                          ignore_eos=ignore_eos, label="%s-turn%d" % (label, len(out) + 1),
                          input_tokens=sum(counter.count(x["content"]) for x in history)))
        if max_turns and len(out) >= max_turns:
            break
    return out


def multi_turn(spec: dict, counter: Counter, words) -> Workload:
    """From a file of conversations (ShareGPT `conversations` or `messages` rows), or generated:
    `conversations` of `turns` each, `input_tokens` per user turn, `output_tokens` per answer."""
    ignore_eos = bool(spec.get("ignore_eos", not spec.get("path")))
    convs: List[List[Prompt]] = []
    if spec.get("path"):
        root = resolve(spec["path"], None, None, "workload")
        for path in data_files(root, None, "workload"):
            for where, row in read_rows(path, "workload"):
                if not isinstance(row, dict):
                    continue
                messages = turns(row.get("conversations") or row.get("messages"))
                conv = _conversation_prompts(where, messages, counter, spec.get("output_tokens"),
                                             spec.get("turns"), ignore_eos)
                if conv:
                    convs.append(conv)
                if spec.get("conversations") and len(convs) >= spec["conversations"]:
                    break
        if not convs:
            raise WorkloadError("workload.path %s: no conversation with a user turn and its "
                                "answer (rows of `conversations` or `messages`)" % root)
        source = root
    else:
        rng = random.Random(spec["seed"])
        for c in range(spec["conversations"]):
            messages = []
            for _turn in range(spec["turns"]):
                ask, _n = filler_text(counter, spec["input_tokens"], rng, words,
                                      head="%06d" % rng.randrange(10 ** 6))
                answer, _m = filler_text(counter, spec["output_tokens"], rng, words)
                messages += [{"role": "user", "content": ask},
                             {"role": "assistant", "content": answer}]
            convs.append(_conversation_prompts("conv%d" % c, messages, counter,
                                               spec["output_tokens"], None, ignore_eos))
        source = "generated"
    prompts: List[Prompt] = []
    order: List[List[int]] = []
    for conv in convs:
        order.append(list(range(len(prompts), len(prompts) + len(conv))))
        prompts.extend(conv)
    return Workload("multi_turn", prompts, "%d conversations, %d turns in all (%s)"
                    % (len(convs), len(prompts), source), token_source=counter.source,
                    conversations=order)


class ConversationOrder:
    """Which prompt a closed-loop worker sends next: whole conversations, one at a time, turns
    in order (the next turn is sent when the previous answer is in, as a worker does). Worker w
    of W starts at conversation w and then takes every W-th; an index lookup per request, so it
    costs the timing path nothing. The level's hook (level.py) is what asks it."""

    def __init__(self, conversations: List[List[int]], worker: int, workers: int):
        if not conversations:
            raise ValueError("no conversations")
        self.conversations = conversations
        self.step = max(1, workers)
        self.conv = worker % len(conversations)
        self.turn = 0

    def next_index(self) -> int:
        conv = self.conversations[self.conv]
        index = conv[self.turn]
        self.turn += 1
        if self.turn >= len(conv):
            self.turn = 0
            self.conv = (self.conv + self.step) % len(self.conversations)
        return index
