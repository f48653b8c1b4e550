"""The simulator's one admission rule and prefill plan, used by the live server's scheduler and by
the discrete-event engine alike (so a prediction is of the scheduler that serves). Standard
library only.

Each step, in this order (SGLang's PrefillAdder, managers/schedule_policy.py):
1. A request whose prompt is partly prefilled (chunked prefill) continues first
   (add_chunked_req, schedule_policy.py:1140; scheduler.py:4176-4184).
2. Queued requests are admitted FIFO while a running slot is free (max_running: SGLang's request
   slots, scheduler.py:4027-4050, 4226-4232), their prompt fits the step's prefill budget and the
   prompt plus its output fits the free KV pool (add_one_req reserves input + max_new_tokens,
   schedule_policy.py:1407-1412, and counts the running requests' remaining outputs,
   schedule_policy.py:674-678, 785-794; the bench's requests are ignore_eos, so the whole
   output). A request that does not fit waits, and so does everything behind it (FIFO).
3. Without chunked prefill (chunk None) a prompt is prefilled whole in the step that admits it;
   the budget is max_prefill_tokens and the first admitted always fits (SGLang: "Without
   chunking, allow the first request even above the input cap", schedule_policy.py:1627-1633).
   With it, the budget is min(chunk, max_prefill_tokens) prompt tokens and the request that
   does not fit whole is split: what fits now, the rest in the next steps
   (schedule_policy.py:1646-1675).
A request that cannot fit even an empty KV pool is admitted alone (the simulator does not
reject it; SGLang refuses a prompt longer than its context).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Generic, List, Optional, Tuple, TypeVar

from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import SimProfile

R = TypeVar("R")


@dataclass
class StepPlan(Generic[R]):
    """What one step prefills. `admitted` took a slot this step; `chunks` are (request, prompt
    tokens prefilled now), the continuing one first; `completed` finished their prompt now (their
    first token comes at the end of the step)."""
    admitted: List[R] = field(default_factory=list)
    chunks: List[Tuple[R, int]] = field(default_factory=list)
    completed: List[R] = field(default_factory=list)
    prefill_tokens: int = 0


def plan_step(queue: deque, prefilling: List[R], running: int, p: SimProfile,
              prompt_tokens: Callable[[R], int], gone: Optional[Callable[[R], bool]] = None, *,
              chunk: Optional[int] = None, prompt_left: Optional[Callable[[R], int]] = None,
              kv_free: float = math.inf, kv_need: Optional[Callable[[R], int]] = None,
              kv_empty: bool = False) -> StepPlan:
    """The step's prefill (see the module docstring). `running`: requests holding a slot
    (decoding and prefilling); `prefilling`: admitted requests with prompt tokens left
    (prompt_left), in admission order; chunk: effects.chunk_size(p) (None: whole prompts);
    kv_free: tokens of the pool not yet promised; kv_empty: nothing holds the pool.
    `gone(request)` true: the request ended while it queued, and is dropped instead."""
    plan: StepPlan = StepPlan()
    chunked = chunk is not None
    budget = min(chunk, p.max_prefill_tokens) if chunked else p.max_prefill_tokens
    if chunked:
        for req in prefilling:
            if budget <= 0:
                break
            left = prompt_left(req)
            n = min(left, budget)
            plan.chunks.append((req, n))
            budget -= n
            if n == left:
                plan.completed.append(req)
    free = p.max_running - running
    new = plan.admitted
    while queue and free > 0 and (budget > 0 or not chunked):
        head = queue[0]
        if gone is not None and gone(head):
            queue.popleft()
            continue
        tokens = prompt_tokens(head)
        if not chunked and new and tokens > budget:
            break
        if kv_need is not None:
            need = kv_need(head)
            if need > kv_free and not (kv_empty and not new and not plan.chunks):
                break
            kv_free -= need
        queue.popleft()
        new.append(head)
        free -= 1
        n = min(tokens, budget) if chunked else tokens
        budget -= n
        plan.chunks.append((head, n))
        if n == tokens:
            plan.completed.append(head)
    plan.prefill_tokens = sum(n for _r, n in plan.chunks)
    return plan


def admit(queue: deque, running: int, p: SimProfile, prompt_tokens: Callable[[R], int],
          gone: Optional[Callable[[R], bool]] = None) -> List[R]:
    """Pop and return the requests one step admits without chunked prefill and without a KV
    bound: FIFO, while fewer than p.max_running run (`running` already do), and while each
    one's prompt tokens fit what is left of the step's prefill budget (p.max_prefill_tokens;
    the first admitted always fits)."""
    return plan_step(queue, [], running, p, prompt_tokens, gone).admitted
