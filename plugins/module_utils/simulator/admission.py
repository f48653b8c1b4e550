"""The simulator's one admission rule, used by the live server's scheduler and by the offline
predictor alike (so a prediction is of the scheduler that serves). Standard library only."""
from __future__ import annotations

from collections import deque
from typing import Callable, List, Optional, TypeVar

from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import SimProfile

R = TypeVar("R")


def admit(queue: deque, running: int, p: SimProfile, prompt_tokens: Callable[[R], int],
          gone: Optional[Callable[[R], bool]] = None) -> List[R]:
    """Pop and return the requests one step admits: FIFO, while fewer than p.max_running run
    (`running` already do), and while each one's prompt tokens fit what is left of the step's
    prefill budget (p.max_prefill_tokens; the first admitted always fits: chunked prefill).
    `gone(request)` true: the request ended while it queued, and is dropped instead."""
    new: List[R] = []
    budget = p.max_prefill_tokens
    free = p.max_running - running
    while queue and free > 0:
        head = queue[0]
        if gone is not None and gone(head):
            queue.popleft()
            continue
        tokens = prompt_tokens(head)
        if new and tokens > budget:
            break
        queue.popleft()
        new.append(head)
        free -= 1
        budget -= tokens
    return new
