"""The searched flags' effects in the simulator (simulator/effects.py, admission.plan_step): each
stated assumption's direction and magnitude on hand-computable profiles, the defaults leaving the
fitted model exactly as it was, the settings' checks, and the live server agreeing with the
discrete-event engine when the flags bind."""
import contextlib
import dataclasses
import re
import threading
import urllib.request

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.simulator import effects
from ansible_collections.servelab.serving.plugins.module_utils.simulator.cli import (
    config_from_args, main,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.predictor import (
    predict_level,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    PROFILES, SimError, resolve_profile, spec_accept_cdf, step_ms,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.runs import predict_run

from simproc import ServerProcess
from test_simulator import closed_loop

# Every step 10 ms plus 0.01 ms per prompt token prefilled in it; nothing else.
FLAT = dataclasses.replace(PROFILES["baseline"], name="flat", step_base_ms=10.0,
                           step_per_req_ms=0.0, moe_ms=0.0, prefill_per_token_ms=0.01,
                           request_overhead_ms=0.0, request_overhead_jitter=0.0,
                           max_prefill_tokens=100_000)


def flat(**kw):
    return dataclasses.replace(FLAT, **kw)


# ---- chunked prefill -----------------------------------------------------------------------------
def test_a_long_prompt_is_prefilled_over_several_steps():
    # 10 000 prompt tokens: whole, one step of 10 + 100 ms; in chunks of 1000, ten steps of
    # 10 + 10 ms, the first token at the end of the tenth.
    whole = predict_run(flat(), concurrency=1, prompt_tokens=10_000, output_tokens=11,
                        requests=3)
    chunked = predict_run(flat(chunked_prefill_size=1000), concurrency=1, prompt_tokens=10_000,
                          output_tokens=11, requests=3)
    assert whole.requests[0].ttft_ms == pytest.approx(110.0)
    assert chunked.requests[0].ttft_ms == pytest.approx(200.0)
    # a prompt that fits one chunk is not split
    fits = predict_run(flat(chunked_prefill_size=1000), concurrency=1, prompt_tokens=800,
                       output_tokens=11, requests=3)
    assert fits.requests[0].ttft_ms == pytest.approx(18.0)


def test_smaller_chunks_trade_long_prompt_ttft_for_the_running_decodes_itl():
    """A 10 000-token prompt arrives every 0.5 s while the previous one decodes. Whole, the step
    that prefills it lasts 110 ms and every running decode waits that long for its next token;
    in chunks of 1000 no step passes 20 ms, and the prompt's own first token comes ~90 ms later.
    The mean ITL stays: the same prefill work, spread over ten steps instead of one."""
    def run(chunk):
        return predict_run(flat(chunked_prefill_size=chunk), rate=2.0, arrival="constant",
                           prompt_tokens=10_000, output_tokens=101, requests=20)
    whole, chunked = run(0), run(1000)
    assert whole.latency("itl_ms", 100) == pytest.approx(110.0)
    assert chunked.latency("itl_ms", 100) == pytest.approx(20.0)
    assert chunked.itl_mean_ms == pytest.approx(whole.itl_mean_ms)
    assert chunked.itl_p99_ms < whole.itl_p99_ms
    assert chunked.mean("ttft_ms") - whole.mean("ttft_ms") == pytest.approx(90.0, abs=10.0)


def test_one_chunk_budget_per_step_serves_the_continuing_prompt_first():
    # two 1500-token prompts together, chunks of 1000: step 1 = A[0:1000]; step 2 = A[1000:1500]
    # + B[0:500]; step 3 = B[500:1500] (and A's second token). Each step 10 + 10 ms.
    p = flat(chunked_prefill_size=1000)
    run = predict_run(p, concurrency=2, prompt_tokens=1500, output_tokens=2, requests=2,
                      warmup=0)
    first, second = sorted(r.ttft_ms for r in run.requests)
    assert first == pytest.approx(40.0)                  # 20 + 20
    assert second == pytest.approx(60.0)


def test_without_mixed_chunks_a_prefill_step_pauses_the_decodes():
    # SGLang's default scheduler runs prefill first and no decode in that step: a running
    # request waits the 110 ms prefill step and then its own 10 ms decode step.
    def run(mixed):
        return predict_run(flat(mixed_chunk=mixed), rate=2.0, arrival="constant",
                           prompt_tokens=10_000, output_tokens=101, requests=20)
    assert run(True).latency("itl_ms", 100) == pytest.approx(110.0)
    assert run(False).latency("itl_ms", 100) == pytest.approx(120.0)


# ---- cuda graphs ----------------------------------------------------------------------------------
def test_a_batch_above_the_cuda_graph_size_steps_slower():
    p = dataclasses.replace(PROFILES["baseline"], cuda_graph_max_bs=8)
    base = PROFILES["baseline"]
    assert step_ms(p, 8) == step_ms(base, 8)
    # eager: the fixed per-step cost paid cuda_graph_eager_factor (2) times
    assert step_ms(p, 9) - step_ms(base, 9) == pytest.approx(base.step_base_ms)
    assert predict_level(p, 4).output_tok_s == predict_level(base, 4).output_tok_s
    slower = predict_level(p, 30).output_tok_s / predict_level(base, 30).output_tok_s
    assert 0.85 < slower < 0.97, slower


# ---- the KV pool ----------------------------------------------------------------------------------
def test_the_pool_grows_with_the_fraction_above_the_weights():
    p = dataclasses.replace(PROFILES["baseline"], kv_capacity_tokens=100_000)
    assert effects.kv_pool_tokens(p) == 100_000                       # fraction not set
    at = [effects.kv_pool_tokens(dataclasses.replace(p, mem_fraction_static=f))
          for f in (0.6, 0.7, 0.9)]
    assert at == [20_000, 40_000, 80_000]                             # (f - 0.5) / 0.5


def test_a_low_memory_fraction_caps_the_running_batch():
    # pool 40 000 tokens, 2048 + 512 per request: 15 fit, whatever max_running says
    p = dataclasses.replace(PROFILES["baseline"], kv_capacity_tokens=100_000,
                            mem_fraction_static=0.7)
    capped = predict_level(p, 64)
    free = predict_level(dataclasses.replace(p, mem_fraction_static=0.0), 64)
    assert capped.mean_running <= 15 + 1e-9 and capped.mean_running > 13
    assert free.mean_running > 30 and capped.mean_queued > 20
    assert capped.output_tok_s < 0.75 * free.output_tok_s       # 15 in the batch, not 39


def test_a_request_larger_than_the_pool_runs_alone_instead_of_waiting_forever():
    p = flat(kv_capacity_tokens=1000)
    run = predict_run(p, concurrency=2, prompt_tokens=2000, output_tokens=5, requests=4)
    assert run.mean_running == pytest.approx(1.0, abs=0.01)


# ---- speculation ----------------------------------------------------------------------------------
def shape(steps, topk, draft, profile="eagle3"):
    return dataclasses.replace(PROFILES[profile], spec_num_steps=steps, spec_eagle_topk=topk,
                               spec_num_draft_tokens=draft)


def test_the_fitted_eagle3_shape_keeps_its_acceptance():
    p = PROFILES["eagle3"]
    model = effects.StepModel(p)
    assert (model.rate, model.depth) == (0.7, 5)
    assert model.tokens_per_step() == pytest.approx(2.94, abs=0.005)
    assert model.cdf() == spec_accept_cdf(0.7, 5)
    assert (p.spec_ref_num_steps, p.spec_ref_eagle_topk, p.spec_ref_draft_tokens) == (5, 4, 16)


def test_topk_raises_the_per_depth_acceptance_and_draft_tokens_cap_it():
    chain = effects.accept_rate(shape(5, 1, 6))          # 1 candidate per depth
    fitted = effects.accept_rate(shape(5, 4, 16))        # 15 drafts over 5 depths: 3 each
    wide = effects.accept_rate(shape(5, 8, 41))          # 8 each
    capped = effects.accept_rate(shape(5, 8, 16))        # topk 8 but only 3 per depth fit
    # a(w) = 1 - 0.3 * 0.8 ** (w - 3)
    assert chain == pytest.approx(1 - 0.3 / 0.8 ** 2)
    assert wide == pytest.approx(1 - 0.3 * 0.8 ** 5)
    assert chain < fitted < wide and capped == fitted
    # fewer draft tokens than steps: the tree is only D - 1 deep
    assert effects.accept_depth(shape(5, 4, 4)) == 3


def test_topk_one_runs_a_chain_of_steps_plus_one_whatever_the_draft_tokens():
    assert effects.spec_shape(3, 1, 16) == effects.spec_shape(3, 1, 4) == (4, 3, 1.0)
    assert step_ms(shape(3, 1, 16), 5) == step_ms(shape(3, 1, 4), 5)


def test_the_verify_costs_each_draft_token_and_the_draft_each_step():
    p = PROFILES["eagle3"]
    more_tokens = step_ms(shape(5, 4, 32), 10) - step_ms(p, 10)
    assert more_tokens == pytest.approx(16 * p.spec_verify_token_ms * 10)
    more_steps = step_ms(shape(7, 4, 16), 1) - step_ms(p, 1)
    assert more_steps == pytest.approx(2 * p.spec_draft_step_ms)
    # stated: at one draft token and no draft step the profile costs what the baseline does
    assert p.step_per_req_ms - 15 * p.spec_verify_token_ms == pytest.approx(
        PROFILES["baseline"].step_per_req_ms, abs=1e-3)
    assert p.step_base_ms - 5 * p.spec_draft_step_ms == pytest.approx(
        PROFILES["baseline"].step_base_ms, abs=1e-3)


def test_a_cheaper_shape_wins_at_higher_concurrency():
    # the model's consequence of the stated costs: a short chain verifies 4 tokens, not 16
    assert predict_level(shape(3, 1, 4), 30).output_tok_s > \
        1.5 * predict_level(PROFILES["eagle3"], 30).output_tok_s


# ---- defaults, settings, checks ------------------------------------------------------------------
DEFAULTS = {"chunked_prefill_size": 0, "mixed_chunk": True, "cuda_graph_max_bs": 0,
            "mem_fraction_static": 0.0}


@pytest.mark.parametrize("name, c", [("baseline", 30), ("eagle3", 5), ("eagle3_dynamic", 30)])
def test_the_flags_at_their_defaults_leave_the_fitted_model_exactly(name, c):
    p, _ts = resolve_profile(dict(DEFAULTS, profile=name, spec_ref_num_steps=0))
    assert predict_level(p, c) == predict_level(name, c)


def test_every_field_is_a_command_line_flag_and_a_profile_key():
    cfg, _args = config_from_args([
        "--profile", "eagle3", "--chunked-prefill-size", "2048", "--mixed-chunk", "false",
        "--cuda-graph-max-bs", "32", "--cuda-graph-eager-factor", "1.5",
        "--mem-fraction-static", "0.85", "--weights-mem-fraction", "0.4",
        "--spec-num-steps", "3", "--spec-eagle-topk", "1", "--spec-num-draft-tokens", "4",
        "--spec-topk-gain", "0.3"])
    p = cfg.profile
    assert (p.chunked_prefill_size, p.mixed_chunk, p.cuda_graph_max_bs) == (2048, False, 32)
    assert (p.cuda_graph_eager_factor, p.mem_fraction_static, p.weights_mem_fraction) == \
        (1.5, 0.85, 0.4)
    assert (p.spec_num_steps, p.spec_eagle_topk, p.spec_num_draft_tokens) == (3, 1, 4)
    mapped, _ts = resolve_profile({"profile": "eagle3", "chunked-prefill-size": "2048",
                                   "mixed_chunk": "false", "cuda_graph_max_bs": 32,
                                   "cuda_graph_eager_factor": 1.5, "mem_fraction_static": 0.85,
                                   "weights_mem_fraction": 0.4, "spec_num_steps": 3,
                                   "spec_eagle_topk": 1, "spec_num_draft_tokens": 4,
                                   "spec_topk_gain": 0.3})
    assert mapped == p


@pytest.mark.parametrize("argv, says", [
    (["--chunked-prefill-size", "-5"], "chunked_prefill_size must be a token count >= 1, or -1"),
    (["--cuda-graph-max-bs", "-1"], "cuda_graph_max_bs must be >= 0"),
    (["--cuda-graph-eager-factor", "0.5"], "cuda_graph_eager_factor must be a number >= 1"),
    (["--mem-fraction-static", "0.3"], "mem_fraction_static 0.3 leaves no KV cache"),
    (["--mem-fraction-static", "1.2"], "mem_fraction_static must be within (0, 1)"),
    (["--weights-mem-fraction", "1"], "weights_mem_fraction must be within [0, 1)"),
    (["--mixed-chunk", "sometimes"], "mixed_chunk must be a bool"),
    (["--profile", "eagle3", "--spec-num-draft-tokens", "70"],
     "spec_num_draft_tokens 70 needs 69 draft tokens but topk 4 over 5 steps scores only 68"),
    (["--profile", "eagle3", "--spec-num-draft-tokens", "1"], "spec_num_draft_tokens must be >= 2"),
    (["--profile", "eagle3", "--spec-topk-gain", "1"], "spec_topk_gain must be within [0, 1)"),
    (["--profile", "eagle3", "--spec-ref-draft-tokens", "99"], "the reference shape (spec_ref_*)"),
])
def test_bad_flag_values_are_refused_before_listening(argv, says, capsys):
    with pytest.raises(SimError) as err:
        config_from_args(argv)
    assert says in str(err.value), str(err.value)
    assert main(argv) == 2
    assert says in capsys.readouterr().err


# ---- the live server agrees with the engine -------------------------------------------------------
@pytest.fixture
def start_sim():
    with contextlib.ExitStack() as running:
        yield lambda *args: running.enter_context(ServerProcess("--host", "127.0.0.1", *args))


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return float(re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))


def test_served_flags_match_the_prediction(start_sim):
    """Chunked prefill (512-token prompts in chunks of 128), a KV pool of 2000 tokens (three
    requests of 512 + 128), CUDA graphs up to a batch of 2: the server runs at most three
    requests whatever the load, and its throughput is the engine's."""
    prompt, output, scale = 512, 128, 10.0
    flags = {"chunked_prefill_size": 128, "kv_capacity_tokens": 4000, "mem_fraction_static": 0.75,
             "cuda_graph_max_bs": 2}
    argv = []
    for key, value in flags.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    srv = start_sim("--profile", "baseline", "--time-scale", scale, *argv)
    seen, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            seen.append(metric(srv.port, "sglang:num_running_reqs"))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        live = closed_loop(srv.port, 6, prompt, output, 4)
    finally:
        stop.set()
        sampler.join(10)
    pred = predict_level(dict(flags, profile="baseline"), 6, prompt, output, time_scale=scale)
    print(f"C=6: live {live:.1f} tok/s, predicted {pred.output_tok_s:.1f} "
          f"({live / pred.output_tok_s - 1:+.1%}), predicted running {pred.mean_running:.2f}")
    assert pred.mean_running <= 3 + 1e-9
    # the band of test_simulator's live check (a busy box runs late, never early)
    assert 0.75 * pred.output_tok_s <= live <= 1.12 * pred.output_tok_s
    # sampled while six clients kept it busy: the pool, not max_running (256), held it at 3
    assert max(seen) == 3, seen
