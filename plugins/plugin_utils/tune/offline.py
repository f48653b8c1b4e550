"""A whole tune without Ansible, against a function that measures one level: the same rounds
(rounds.py), capacity searches (capacity.py) and records as tune.yml's, with `measure` standing
for llm_bench. The unit tests and benchmarks/tune_bench.py drive it with the simulator's
predict_run as the engine (an oracle: what the live simulator would measure, with its own
sampling noise); tune.yml drives the same pieces through the bench role.
Controller only, standard library only.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

from ansible_collections.servelab.serving.plugins.plugin_utils.tune import rounds
from ansible_collections.servelab.serving.plugins.plugin_utils.tune import state as st
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.capacity import (
    Outcome, Search, SearchSpec, Step,
)


class TrialFailed(Exception):
    """The engine could not run this trial (it would not start, it died): the message is why."""


def run_tune(settings: Mapping, measure: Callable[[Mapping, Step], Mapping],
             model=None, max_trials: Optional[int] = None) -> st.TuneState:
    """Tune to the end (the budget, the stop rule or max_trials); `measure(flags, step)` returns
    the level row of that trial at that step, or raises TrialFailed."""
    state = st.TuneState(settings=dict(settings), started_at=st.now())
    if model is None and settings.get("strategy") != "grid":
        model = rounds.model_for(settings)
    while max_trials is None or len(state.trials) < max_trials:
        trial, why = rounds.next_trial(state, settings, model)
        if trial is None:
            state.done = why
            break
        state.trials.append(trial)
        search = Search(SearchSpec.parse(trial.search))
        rows, record = [], {"status": "finished"}
        nxt = search.next_step()
        while not isinstance(nxt, Outcome):
            try:
                row = measure(trial.flags, nxt)
            except TrialFailed as exc:
                record = {"status": "failed", "error": str(exc)}
                nxt = None
                break
            rows.append(dict(row, window_s=row.get("window_s", nxt.seconds)))
            search.add(nxt.x, nxt.phase, row)
            nxt = search.next_step()
        outcome = None
        if nxt is not None:
            outcome = nxt.as_dict()
            outcome["levels_measured"] = [
                {"x": m.x, "phase": m.phase, "passed": m.judgement.passed,
                 "score": m.judgement.score} for m in search.levels]
        rounds.record(trial, record, outcome, rows)
    return state


class SimulatorEngine:
    """An engine for run_tune: the simulator with `truth` (a `simulator:` mapping, the engine's
    hidden parameters) measured as llm_bench would measure the live simulator, level by level:
    predict_run over the level's window with the load generator's arrivals, a fresh seed per
    level (the sampling noise of a real window). `failing`: flags -> why the server would not
    start (OOM, a refused flag), to exercise failed trials."""

    def __init__(self, truth: Mapping, prompt_tokens: int, output_tokens: int, slo: Mapping,
                 axis: str = "rate", seed: int = 1, failing=None,
                 timeout_s: Optional[float] = None):
        self.truth = dict(truth)
        self.prompt, self.output = prompt_tokens, output_tokens
        self.slo = dict(slo)
        self.axis = axis
        self.seed = seed
        self.failing = failing
        # llm_bench's level_timeout; None: ten times the level's own length, plus 30 s (an
        # overloaded level then costs a bounded time and memory to predict)
        self.timeout_s = timeout_s
        self.levels = 0
        self.seconds = 0.0

    def params(self, flags: Mapping) -> dict:
        # pylint: disable-next=import-outside-toplevel
        from ansible_collections.servelab.serving.plugins.plugin_utils.tune.simulator import (
            simulator_fields,
        )
        fields = simulator_fields()
        out = dict(self.truth)
        for flag, value in flags.items():
            out[fields[flag]] = value
        return out

    def run(self, flags: Mapping, x: float, seconds: Optional[float] = None,
            requests: Optional[int] = None, seed: Optional[int] = None, warmup=None):
        # pylint: disable-next=import-outside-toplevel
        from ansible_collections.servelab.serving.plugins.module_utils.simulator.runs import (
            predict_run,
        )
        load = {"rate": float(x)} if self.axis == "rate" else {"concurrency": int(x)}
        return predict_run(self.params(flags), prompt_tokens=self.prompt,
                           output_tokens=self.output, seconds=seconds, requests=requests,
                           seed=self.seed * 100003 + self.levels if seed is None else seed,
                           slo=self.slo, warmup=warmup, timeout_s=self._timeout(x, seconds,
                                                                                requests),
                           **load)

    def _timeout(self, x, seconds, requests) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        length = seconds if seconds else (requests / float(x) if self.axis == "rate"
                                          else float(requests))
        return 30.0 + 10.0 * length

    def __call__(self, flags: Mapping, step: Step) -> dict:
        if self.failing is not None:
            why = self.failing(flags)
            if why:
                raise TrialFailed(why)
        self.levels += 1
        run = self.run(flags, step.x, seconds=step.seconds)
        self.seconds += run.window_s
        return level_row(run, self.axis, step.x)


def level_row(run, axis: str, x: float) -> dict:
    """A predicted run as llm_bench's level row (the fields the tuner reads). The output tok/s
    95% half-width is the count noise of the window's requests, 1.96 / sqrt(n), relative: the
    simulator has no batch-means of its own here. Window requests the level timeout cut (an
    overloaded load) miss every latency limit: a percentile their share reaches is infinite."""
    n = max(1, len(run.requests))
    row = {"requests": len(run.requests), "errors": 0, "window_s": run.window_s,
           "output_tok_s": run.output_tok_s, "output_tok_s_ci95": run.output_tok_s * 1.96 / n ** 0.5,
           "request_s": run.request_s, "goodput_request_s": run.goodput,
           "client_limited": False, "load_mode": "rate" if axis == "rate" else "concurrency",
           "request_rate": x if axis == "rate" else None,
           "concurrency": int(x) if axis == "concurrency" else 0}
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        for q in (50, 90, 99):
            cut = run.failed > (1.0 - q / 100.0) * n
            row["%s_p%d_ms" % (key[:-3], q)] = float("inf") if cut or not run.requests \
                else run.latency(key, q)
    return row
