"""The discrete-event twin of the server's scheduler loop: the same admission rule, step formula
and seeded draws as SimServer, run in model milliseconds without sockets or sleeps. predict_level
(predictor.py) and predict_run (runs.py) both drive it; they differ only in what they measure
(an Observer). Standard library only.

A request is a list (for speed) indexed by the constants below. The engine never reads a clock:
a step lasts step_ms(...) model milliseconds and every token of it is emitted at its end, which
is when the server's loop emits it too.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Iterator, List, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.simulator.admission import plan_step
from ansible_collections.servelab.serving.plugins.module_utils.simulator.effects import StepModel
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    SimError, SimProfile, speculation_on, switch_ms,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.requests import _Draws, overhead_factor

# Fields of a request record.
LEFT = 0        # tokens still to emit
SEND = 1        # model ms the client sent it
FIRST = 2       # model ms its first token was emitted
DRAWS = 3       # its accepted-length draws (speculation) or None
INDEX = 4       # arrival number (1-based), the seed of its draws as on the server
PREV = 5        # model ms of its last chunk
ITL = 6         # {gap / k: weight} of its chunks, or None when not tracked
LAST = 7        # model ms of its last token
PREFILL = 8     # prompt tokens still to prefill (chunked prefill)

MAX_STEPS = 50_000_000


class Observer:
    """What a prediction measures. The engine calls, per step: on_step once, on_finish for each
    request that finished in it (in batch order), then end_step, which returns True to stop."""

    def on_send(self, req: list) -> None:
        """A request was sent (req[SEND] set); set req[ITL] to a dict to track its chunk gaps."""

    def on_step(self, t: float, dt: float, emitted: int, batch: int, queued: int,
                firsts: int) -> None:
        """A step ended at t: it lasted dt, emitted `emitted` tokens, served `batch` requests
        (decoding + newly admitted), left `queued` waiting for admission, and gave `firsts`
        requests their first token (their prompts are done)."""

    def on_finish(self, req: list, t: float) -> None:
        """req emitted its last token at t (req[LAST] == t)."""

    def end_step(self, t: float) -> bool:
        return False


class Engine:
    """One run of the scheduler model: `send` (closed loop, from an observer) or `arrivals`
    (open loop: an iterator of send times, model ms, ascending) put requests in; run() steps."""

    def __init__(self, p: SimProfile, prompt_tokens: int, output_tokens: int, seed: int,
                 arrivals: Optional[Iterator[float]] = None):
        if p.mode != "batched":
            raise SimError(f"the discrete-event model runs batched profiles (got mode {p.mode})")
        self.p, self.P, self.O, self.seed = p, prompt_tokens, output_tokens, seed
        self.model = StepModel(p)
        self.fixed_k = p.tokens_per_chunk
        self.cdf = self.model.cdf() if p.speculative and not self.fixed_k else None
        self.t = 0.0
        self.pending: List[Tuple[float, int, list]] = []   # heap (t_eligible, index, request)
        self.queue: deque = deque()
        self.running: List[list] = []          # decoding
        self.prefilling: List[list] = []       # admitted, prompt partly prefilled
        self.sent = 0
        self._arrivals = arrivals
        self._next_arrival = float("inf")
        self._pull()

    def _pull(self) -> None:
        if self._arrivals is not None:
            self._next_arrival = next(self._arrivals, float("inf"))

    def send(self, now: float, observer: Optional[Observer] = None) -> list:
        """A client sends a request at `now`: it is admitted no earlier than now plus its share of
        the per-request overhead (seeded by its arrival number, as on the server)."""
        self.sent += 1
        index = self.sent
        p = self.p
        req = [0, now, 0.0, None if self.cdf is None else _Draws(self.seed, index, self.cdf),
               index, 0.0, None, 0.0, self.P]
        eligible = now + p.request_overhead_ms * overhead_factor(p, self.seed, index)
        heapq.heappush(self.pending, (eligible, index, req))
        if observer is not None:
            observer.on_send(req)
        return req

    def _arrive_until(self, t: float, observer: Observer) -> None:
        while self._next_arrival <= t:
            self.send(self._next_arrival, observer)
            self._pull()

    def run(self, observer: Observer) -> None:
        """Step until observer.end_step says stop; SimError if nothing is left to serve first."""
        p, P, O = self.p, self.P, self.O  # noqa: E741 (the model's names)
        model = self.model
        fixed_k = self.fixed_k
        per_step = fixed_k or 1
        first = min(O, fixed_k or 1)
        pending, queue = self.pending, self.queue
        running, prefilling = self.running, self.prefilling
        t = self.t
        previous_on: Optional[bool] = None
        need = P + O                               # KV: the prompt and the whole output
        chunk, pool, mixed = model.chunk, model.kv_pool, model.mixed

        def prompt_of(_req: list) -> int:
            return P                               # every request of the workload has P

        def prompt_left(req: list) -> int:
            return req[PREFILL]

        def kv_need(_req: list) -> int:
            return need

        for _step in range(MAX_STEPS):
            self._arrive_until(t, observer)
            if not running and not queue and not prefilling:
                # idle: the next eligible request starts a step
                nxt = pending[0][0] if pending else float("inf")
                while self._next_arrival <= nxt:
                    self.send(self._next_arrival, observer)
                    self._pull()
                    nxt = pending[0][0]
                if nxt == float("inf"):
                    raise SimError("prediction ran out of requests before it finished")
                t = max(t, nxt)
                while pending and pending[0][0] <= t:
                    queue.append(heapq.heappop(pending)[2])
            while pending and pending[0][0] < t:   # became eligible during the last step
                queue.append(heapq.heappop(pending)[2])
            holding = len(running) + len(prefilling)
            used = holding * need
            plan = plan_step(queue, prefilling, holding, p, prompt_of, chunk=chunk,
                             prompt_left=prompt_left, kv_free=pool - used, kv_need=kv_need,
                             kv_empty=not used)
            chunks = plan.chunks
            queued = len(queue)
            # without mixed chunks a step that prefills runs no decode (SGLang's default)
            decoding = len(running) if mixed or not chunks else 0
            if decoding or mixed or not chunks:
                on = speculation_on(p, decoding, len(chunks), previous_on)
                dt = (model.step_ms(decoding, plan.prefill_tokens, on)
                      + switch_ms(p, on, previous_on))
                previous_on = on
            else:
                on = previous_on is not False
                dt = model.step_ms(0, plan.prefill_tokens, on)
            t += dt
            emitted = 0
            finished: List[list] = []
            if decoding:
                for req in running:
                    draws = req[DRAWS]
                    k = per_step if draws is None or not on else draws.next()
                    if k >= req[LEFT]:
                        k = req[LEFT]
                        finished.append(req)
                    req[LEFT] -= k
                    emitted += k
                    itl = req[ITL]
                    if itl is not None and k > 0:
                        key = (t - req[PREV]) / k
                        itl[key] = itl.get(key, 0) + k
                        req[PREV] = t
            if chunk is not None:
                for req, n in chunks:
                    req[PREFILL] -= n
                prefilling[:] = [r for r in prefilling + plan.admitted if r[PREFILL] > 0]
            for req in plan.completed:
                req[FIRST] = t
                req[PREV] = t
                req[LEFT] = O - first
                emitted += first
                if req[LEFT] <= 0:
                    finished.append(req)
                else:
                    running.append(req)
            self.t = t
            observer.on_step(t, dt, emitted, decoding + len(chunks), queued, len(plan.completed))
            if finished:
                gone = set(map(id, finished))
                running[:] = [r for r in running if id(r) not in gone]
                for req in finished:
                    req[LAST] = t
                    observer.on_finish(req, t)
            if observer.end_step(t):
                return
        raise SimError("prediction did not reach a steady state (step budget exhausted)")
