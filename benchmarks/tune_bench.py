"""The tuner against the full grid, on the simulator whose model makes the true optimum
computable (issue 27's proof; prints figures, writes benchmarks/results/tune-<date>.md).

For each case (a search space, an SLO, an objective, a workload):

- The engine: the simulator with hidden parameters (`truth`) that differ from the tuner's prior
  (the base profile the tuner is given: the field fit, `prior`), so that the prior's own best
  candidate is not the true one and the tuner has to measure. The gap is printed: the prior's
  pick, never measured, is scored by the truth.
- The truth: every candidate's true capacity (the highest rate whose p99 latencies meet the SLO,
  bisected to 1 % with 400-request windows and a fixed seed) and its true score there (goodput,
  or output tok/s). The grid optimum is the best of them.
- The tuner: plugin_utils/tune/offline.run_tune, the same rounds, capacity searches and
  records as tune.yml, against an oracle (offline.SimulatorEngine): each level is predict_run
  of the true engine over the level's window with a fresh seed (the sampling noise a window of
  the live simulator has; not the live server: the client's own timing noise is left out).
  Budget: a third of the grid's trials. Run with NOISE_SEEDS different noise seeds.
  Reached: the TRUE score of the configuration the tuner calls best, over the optimum.
- vLLM's strategy (benchmarks/auto_tune/auto_tune.sh, vLLM at 01277f9): every candidate, a
  level at an infinite rate (1000 requests at once), then from int(throughput) + 1 req/s down by
  1 req/s (100 requests a level) until the SLO holds (the script's check is p99 E2E alone; here
  the case's SLO, the same rule as the tuner's); the best by throughput. Same oracle.

Reported per case and run: trials, levels, measured seconds (each level from its first send to
its last answer, warm-up included), the true score reached and its ratio to the optimum; then
the ratios of trials, levels and seconds to vLLM's strategy.

Usage: .venv/bin/python benchmarks/tune_bench.py [--cases A,B,C] [--seeds 3] [--write-md PATH]
Truth tables are cached under .cache/tune_bench/ (keyed by everything that decides them).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402
collection_link.importable()
from ansible_collections.servelab.serving.plugins.plugin_utils.report.table import Table  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.tune import offline  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.tune import settings as tune_settings  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.model import simulator_model  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.objective import Objective  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.space import key  # noqa: E402

CACHE = os.path.join(REPO, ".cache", "tune_bench")
TRUTH_REQUESTS = 1000
TRUTH_SEED = 11
VLLM_INF_REQUESTS = 1000
VLLM_STEP_REQUESTS = 100
INF_RATE = float("inf")


@dataclass
class Case:
    name: str
    what: str
    prompt: int
    output: int
    slo: dict
    metric: str
    prior: dict                     # the base profile's simulator settings (the tuner's prior)
    truth: dict                     # what the engine has instead (hidden from the tuner)
    space: dict
    level_seconds: float
    failing: Optional[Callable[[dict], Optional[str]]] = None
    failing_text: str = ""
    first_load: float = 4.0
    extra: dict = field(default_factory=dict)

    def truth_params(self) -> dict:
        return dict(self.prior, **self.truth)


def _oom(flags) -> Optional[str]:
    need = flags["--mem-fraction-static"] + 0.001 * flags["--cuda-graph-max-bs"]
    if need > 0.93:
        return ("CUDA out of memory while capturing CUDA graphs (mem_fraction_static %g + "
                "graphs up to bs %d leave no activation memory)"
                % (flags["--mem-fraction-static"], flags["--cuda-graph-max-bs"]))
    return None


CASES = {
    "A": Case(
        "A", "max_running_requests x chunked_prefill_size, goodput under p99 TTFT and TPOT, "
             "4096-token prompts, SGLang's default scheduler (mixed_chunk off)",
        prompt=4096, output=128, slo={"ttft_ms": 200, "tpot_ms": 2.25}, metric="goodput",
        prior={"profile": "baseline", "time_scale": 40, "mixed_chunk": False},
        truth={"step_per_req_ms": 1.5, "prefill_per_token_ms": 0.08,
               "request_overhead_ms": 350},
        space={"max_running_requests": [8, 16, 24, 32, 48, 64, 96, 128],
               "chunked_prefill_size": [-1, 512, 1024, 2048, 4096]},
        level_seconds=20, first_load=20),
    "B": Case(
        "B", "cuda_graph_max_bs x mem_fraction_static, output tok/s under p99 TTFT, the KV pool "
             "binding; the engine runs out of memory where the graphs and the pool together "
             "ask too much (a failed trial)",
        prompt=2048, output=256, slo={"ttft_ms": 150}, metric="output_tok_s",
        prior={"profile": "baseline", "time_scale": 40, "max_running": 128,
               "kv_capacity_tokens": 150000},
        truth={"step_per_req_ms": 1.3, "kv_capacity_tokens": 110000,
               "cuda_graph_eager_factor": 3.0, "request_overhead_ms": 500},
        space={"cuda_graph_max_bs": [8, 16, 32, 64, 128],
               "mem_fraction_static": [0.6, 0.7, 0.8, 0.85, 0.9]},
        level_seconds=20, failing=_oom,
        failing_text="OOM when mem_fraction_static + 0.001 x cuda_graph_max_bs > 0.93",
        first_load=40),
    "C": Case(
        "C", "speculative_num_steps x speculative_eagle_topk x speculative_num_draft_tokens "
             "(EAGLE-3), goodput under p99 TTFT and TPOT",
        prompt=1024, output=256, slo={"ttft_ms": 125, "tpot_ms": 0.75}, metric="goodput",
        prior={"profile": "eagle3", "time_scale": 40, "max_running": 64},
        truth={"spec_accept_rate": 0.55, "spec_topk_gain": 0.35, "spec_draft_step_ms": 3.0,
               "request_overhead_ms": 400},
        space={"speculative_num_steps": [1, 2, 3, 4, 5],
               "speculative_eagle_topk": [1, 2, 4, 8],
               "speculative_num_draft_tokens": [2, 4, 8, 16]},
        level_seconds=20, first_load=20),
}


def settings_for(case: Case) -> tuple:
    """The tuner's settings through tune.yml's own preflight (settings.check_tune)."""
    values = {
        "tune_space": case.space,
        "bench_profiles": [{"name": "base", "simulator": dict(case.prior)}],
        "bench_slo": case.slo, "bench_level_seconds": case.level_seconds,
        "bench_workload": {"kind": "synthetic", "input_tokens": case.prompt,
                           "output_tokens": case.output},
        "bench_max_tokens": case.output,
        "tune_objective": {"metric": case.metric, "percentile": 99}, "tune_axis": "rate",
        "tune_budget": {"trials": 1}, "tune_tolerance": 0.03, "tune_min_trials": 3,
        "tune_max_levels": 12, "tune_concurrency_cap": 1024, "tune_strategy": "model",
        "tune_base_profile": "", "tune_first_load": case.first_load,
    }
    check = tune_settings.check_tune(values, [], {}, "bench")
    if check.problems:
        raise SystemExit("case %s: %s" % (case.name, "; ".join(p.message for p in check.problems)))
    return check


def engine(case: Case, seed: int) -> offline.SimulatorEngine:
    return offline.SimulatorEngine(case.truth_params(), case.prompt, case.output, case.slo,
                                   seed=seed, failing=case.failing)


def _passes(run, objective: Objective) -> bool:
    if not run.requests or run.failed > (1.0 - objective.percentile / 100.0) * len(run.requests):
        return False
    for name, limit in objective.slo.items():
        value = run.latency(name, objective.percentile)
        if value is None or value > limit:
            return False
    return True


def _score(run, objective: Objective) -> float:
    return run.goodput if objective.metric == "goodput" else run.output_tok_s


def true_capacity(eng, flags, objective: Objective):
    """(capacity, score) by bisection to 1 % with TRUTH_REQUESTS-request windows; None when the
    engine fails this configuration or no rate meets the SLO."""
    if eng.failing is not None and eng.failing(flags):
        return None

    def at(x):
        run = eng.run(flags, x, requests=TRUTH_REQUESTS, seed=TRUTH_SEED)
        return _passes(run, objective), run
    x = 10.0
    ok, run = at(x)
    good = (x, run) if ok else None
    lo = hi = None
    if ok:
        while ok and x < 5000:
            good = (x, run)
            x *= 2
            ok, run = at(x)
        lo, hi = good[0], x
    else:
        while not ok and x > 0.05:
            hi = x
            x /= 2
            ok, run = at(x)
        if not ok:
            return None
        good, lo = (x, run), x
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        ok, run = at(mid)
        if ok:
            lo, good = mid, (mid, run)
        else:
            hi = mid
    return good[0], _score(good[1], objective)


def truth_table(case: Case, check) -> Dict[str, Optional[list]]:
    objective = Objective.parse(check.settings["objective"])
    blob = json.dumps({"truth": case.truth_params(), "space": case.space, "slo": case.slo,
                       "metric": case.metric, "p": case.prompt, "o": case.output,
                       "failing": case.failing_text, "n": TRUTH_REQUESTS, "seed": TRUTH_SEED,
                       "v": 4}, sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    path = os.path.join(CACHE, "truth-%s-%s.json" % (case.name, digest))
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    eng = engine(case, 0)
    table = {}
    for flags in check.candidates:
        found = true_capacity(eng, flags, objective)
        table[key(flags)] = list(found) if found else None
    os.makedirs(CACHE, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(table, fh, indent=1, sort_keys=True)
    return table


def _span(run, rate: float, warmup: int = 0) -> float:
    """A level's measuring time: first send to last answer, the warm-up's arrivals before."""
    if not run.requests:
        return 0.0
    first = min(r.t_send_ms for r in run.requests)
    last = max(r.t_send_ms + (r.e2e_ms if r.e2e_ms is not None else 0.0) for r in run.requests)
    return (last - first) / 1000.0 + (warmup / rate if math.isfinite(rate) else 0.0)


def run_tuner(case: Case, check, seed: int, budget: int) -> dict:
    settings = dict(check.settings, budget={"trials": budget})
    eng = engine(case, seed)
    spans: List[float] = []
    started = time.time()
    state = offline.run_tune(settings, _recording(eng, spans))
    best = state.best()
    return {"state": state, "trials": len(state.trials),
            "levels": sum(t.levels for t in state.trials), "seconds": sum(spans),
            "best": best.key if best else None, "best_score": best.score if best else None,
            "compute_s": time.time() - started, "done": state.done}


def _recording(eng, spans):
    def measure(flags, step):
        if eng.failing is not None and eng.failing(flags):
            raise offline.TrialFailed(eng.failing(flags))
        eng.levels += 1
        run = eng.run(flags, step.x, seconds=step.seconds)
        spans.append(_span(run, step.x, math.ceil(step.x)))
        return offline.level_row(run, "rate", step.x)
    return measure


def same_server(check) -> Dict[str, str]:
    """{candidate key: the key of the candidate the engine runs it as}: the tuner's dedupe
    (settings.same_server), which vLLM's grid does not have."""
    prefix = "the engine runs it as the same server as "
    return {r["key"]: r["reason"][len(prefix):] for r in check.refused
            if r.get("kind") == "same server"}


def grid_keys(check) -> List[str]:
    """The grid a user's space gives: every combination the engine runs (its refusals left out),
    the ones it runs as the same server included."""
    return [key(f) for f in check.candidates] + sorted(same_server(check))


def run_vllm(case: Case, check) -> dict:
    """run_vllm_walk, cached under .cache/tune_bench/ (it does not depend on the tuner: the
    same case gives the same walk, its seed fixed)."""
    blob = json.dumps({"truth": case.truth_params(), "space": case.space, "slo": case.slo,
                       "metric": case.metric, "p": case.prompt, "o": case.output,
                       "failing": case.failing_text, "grid": grid_keys(check), "v": 1},
                      sort_keys=True)
    path = os.path.join(CACHE, "vllm-%s-%s.json" % (
        case.name, hashlib.sha256(blob.encode()).hexdigest()[:12]))
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    out = run_vllm_walk(case, check)
    os.makedirs(CACHE, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1, default=str)
    return out


def run_vllm_walk(case: Case, check) -> dict:
    """auto_tune.sh's loop with the oracle (module docstring), over the whole grid: a candidate
    the engine runs as the same server as another counts its twin's measurements (the same
    server, so the same levels; measured once to spare the benchmark's own time)."""
    objective = Objective.parse(check.settings["objective"])
    eng = engine(case, 1000)
    levels, seconds, rows = 0, 0.0, []
    best = None
    twins = same_server(check)
    walked: Dict[str, tuple] = {}
    for k in grid_keys(check):
        if k in twins and twins[k] in walked:
            lv, sec, rate, value = walked[twins[k]]
            levels += lv
            seconds += sec
            rows.append((k, rate, value))
            continue
        flags = next(f for f in check.candidates if key(f) == k)
        before = (levels, seconds)
        if eng.failing is not None and eng.failing(flags):
            rows.append((k, "failed", None))
            walked[k] = (0, 0.0, None, None)
            continue
        eng.levels += 1
        # request rate inf: all 1000 at once (a closed loop of 1000 clients, its window the
        # first 1000 sends; the resends after them queue behind: FIFO admission)
        burst = offline.SimulatorEngine(eng.truth, eng.prompt, eng.output, eng.slo,
                                        axis="concurrency", timeout_s=eng.timeout_s)
        run = burst.run(flags, VLLM_INF_REQUESTS, requests=VLLM_INF_REQUESTS, warmup=0,
                        seed=eng.levels)
        levels += 1
        span = _span(run, INF_RATE)
        seconds += span
        throughput = len(run.requests) / span if span else 0.0
        rate, found = None, None
        if _passes(run, objective):
            rate, found = "inf", run
        else:
            r = int(throughput) + 1
            while r > 0:
                eng.levels += 1
                run = eng.run(flags, float(r), requests=VLLM_STEP_REQUESTS, warmup=0)
                levels += 1
                seconds += _span(run, r)
                if _passes(run, objective):
                    rate, found = r, run
                    break
                r -= 1
        if found is None:
            rows.append((k, "no rate met the SLO", None))
            walked[k] = (levels - before[0], seconds - before[1], None, None)
            continue
        thr = found.request_s if rate != "inf" else throughput
        value = found.output_tok_s if objective.metric == "output_tok_s" else thr
        rows.append((k, rate, value))
        walked[k] = (levels - before[0], seconds - before[1], rate, value)
        if best is None or value > best[1]:
            best = (k, value, rate)
    return {"trials": len(grid_keys(check)), "levels": levels, "seconds": seconds,
            "best": best[0] if best else None, "best_rate": best[2] if best else None,
            "rows": rows}


def prior_pick(case: Case, check) -> Optional[str]:
    """The candidate the prior model ranks best, without a single measurement."""
    model = simulator_model(check.settings)
    ranked = sorted(check.candidates, key=lambda f: -model.predict(f).score)
    return key(ranked[0]) if ranked else None


def ratio(table, k) -> Optional[float]:
    best = max(v[1] for v in table.values() if v)
    value = table.get(TWINS.get(k, k))
    return (value[1] / best) if value else 0.0


TWINS: Dict[str, str] = {}    # the current case's same-server map (ratio looks twins up)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--write-md", default=None)
    args = ap.parse_args(argv)
    out: List[str] = []

    def say(line=""):
        print(line, flush=True)
        out.append(line)
    say("# The tuner against the full grid (benchmarks/tune_bench.py)")
    say()
    say("Run %s on %s; every figure below was measured in this run. Engine: the simulator "
        "with the hidden parameters of each case; levels measured by an oracle "
        "(plugin_utils/tune/offline.py: predict_run of the true engine over each level's "
        "window, a fresh seed per level), not the live server." % (
            datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            os.uname().nodename))
    summary = []
    for name in args.cases.split(","):
        case = CASES[name]
        check = settings_for(case)
        TWINS.clear()
        TWINS.update(same_server(check))
        grid = len(grid_keys(check))
        budget = grid // 3
        say()
        say("## Case %s: %s" % (case.name, case.what))
        say()
        objective = Objective.parse(check.settings["objective"])
        say("- objective: %s; workload %d prompt / %d output tokens; open loop (Poisson)"
            % (objective.describe(), case.prompt, case.output))
        refused = sum(1 for r in check.refused if r.get("kind") != "same server")
        say("- space: %s = %d combinations; %d refused by the engine's rules, so a grid of %d "
            "runnable ones (%d of them the same server as another, which the tuner tries once: "
            "%d distinct); tuner budget %d trials (a third of the grid)" % (
                " x ".join("%s %s" % (k, v) for k, v in case.space.items()),
                grid + refused, refused, grid, len(TWINS), len(check.candidates), budget))
        say("- the tuner's prior (base profile): %s; the engine's hidden parameters: %s%s"
            % (json.dumps(case.prior), json.dumps(case.truth),
               "; " + case.failing_text if case.failing_text else ""))
        started = time.time()
        table = truth_table(case, check)
        best_key = max((k for k, v in table.items() if v), key=lambda k: table[k][1])
        say("- the truth: optimum %s = %.4g %s at %.4g req/s (%d of %d candidates met the SLO "
            "at some rate; %.0f s to compute or read)" % (
                best_key, table[best_key][1], objective.unit, table[best_key][0],
                sum(1 for v in table.values() if v), grid, time.time() - started))
        pick = prior_pick(case, check)
        say("- honesty: the prior's own best, never measured, is %s: %.1f %% of the optimum"
            % (pick, 100 * ratio(table, pick)))
        vllm = run_vllm(case, check)
        vr = ratio(table, vllm["best"]) if vllm["best"] else 0.0
        rows = []
        runs = []
        for seed in range(1, args.seeds + 1):
            res = run_tuner(case, check, seed, budget)
            runs.append(res)
            r = ratio(table, res["best"]) if res["best"] else 0.0
            rows.append(["tuner seed %d" % seed, str(res["trials"]), str(res["levels"]),
                         "%.0f" % res["seconds"], res["best"] or "-",
                         "%.4g" % (r * max(v[1] for v in table.values() if v)),
                         "%.1f %%" % (100 * r),
                         "%.2f" % (res["trials"] / grid),
                         "%.2f" % (res["levels"] / vllm["levels"]),
                         "%.2f" % (res["seconds"] / vllm["seconds"]),
                         "%.0f" % res["compute_s"]])
        rows.append(["vLLM grid + walk", str(vllm["trials"]), str(vllm["levels"]),
                     "%.0f" % vllm["seconds"], vllm["best"] or "-",
                     "%.4g" % (vr * max(v[1] for v in table.values() if v)),
                     "%.1f %%" % (100 * vr), "1.00", "1.00", "1.00", "-"])
        t = Table(["strategy", "trials", "levels", "measured s", "best found",
                   "its true score", "of optimum", "trials / grid", "levels / vLLM",
                   "seconds / vLLM", "compute s"], rows)
        say()
        say(t.to_markdown())
        say()
        trials = "; ".join("seed %d: %s" % (i + 1, ", ".join(
            "%s %s %s" % (tr.name, tr.key, tr.status) for tr in res["state"].trials))
            for i, res in enumerate(runs))
        say("Trials (seed by seed): %s." % trials)
        say()
        say("How each tune ended: %s." % "; ".join(
            "seed %d: %s" % (i + 1, res["done"]) for i, res in enumerate(runs)))
        ok = all(ratio(table, res["best"]) >= 0.98 and res["trials"] <= grid / 3
                 for res in runs if res["best"])
        summary.append([case.name, str(grid), "%d-%d" % (min(r["trials"] for r in runs),
                                                         max(r["trials"] for r in runs)),
                        "%.1f-%.1f %%" % (100 * min(ratio(table, r["best"]) for r in runs),
                                          100 * max(ratio(table, r["best"]) for r in runs)),
                        "%.1f %%" % (100 * vr), "%.1f %%" % (100 * ratio(table, pick)),
                        "%.2f" % (sum(r["levels"] for r in runs) / len(runs) / vllm["levels"]),
                        "%.2f" % (sum(r["seconds"] for r in runs) / len(runs)
                                  / vllm["seconds"]),
                        "yes" if ok and all(r["best"] for r in runs) else "NO"])
    say()
    say("## Summary")
    say()
    say(Table(["case", "grid trials", "tuner trials", "tuner reached (true, of optimum)",
               "vLLM reached", "prior alone", "levels / vLLM (mean)", "seconds / vLLM (mean)",
               "within 2 % in <= 1/3 of the trials"], summary).to_markdown())
    if args.write_md:
        with open(args.write_md, "w", encoding="utf-8") as fh:
            fh.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
