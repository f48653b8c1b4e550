# -*- coding: utf-8 -*-
"""llm_bench: run load levels against an LLM server from the bench client and measure them.

Thin module: the logic is plugins/module_utils/loadgen/ (options, config, level, metrics, workloads).
The action plugin of the same name (plugins/action/llm_bench.py) loops over the levels on the
controller and writes the results; this module runs on the bench client.
"""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_bench
short_description: Load-test an LLM server level by level and measure it honestly
description:
  - Runs a closed-loop (constant concurrency) or open-loop (request rate) load level against an
    OpenAI-compatible or SGLang server, streaming every answer, and measures TTFT, TPOT, ITL, E2E,
    output and total tok/s, request/s and goodput over a steady-state window (warmup, ramp and
    drain excluded), with a 95% confidence interval, the client's own CPU and event-loop lag, and
    the server's C(/metrics) over the window.
  - "The action plugin of the same name runs on the controller: it calls this module once per
    level (on the task's host, normally the bench client via C(delegate_to)), prints progress,
    and writes each finished level to C(results/<run_id>/parts/) on the controller, then rebuilds
    C(levels.csv) and C(requests.jsonl) under the run's lock, and C(levels.parquet) and
    C(requests.parquet) where pandas and pyarrow are installed on the controller (optional for
    llm_bench: the collection's requirements.txt). A level whose requests all failed
    stops the sweep for that profile (the task fails with the reason); finished levels are kept."
  - The load generator uses the Python standard library only (bare bench clients work).
  - "Definitions (each defined once, in plugins/module_utils/loadgen/metrics.py): TTFT = send to first
    chunk with generated tokens; TPOT = (last - first) / (completion_tokens - 1); ITL per token,
    a chunk of k tokens giving k samples of gap/k (labelled C(itl_basis=chunk) when the server does
    not report per-chunk counts); tokens as reported by the server, never the requested maximum."
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  base_url:
    description: Server root, e.g. C(http://10.0.0.5:30000) (a trailing C(/v1) is accepted).
    type: str
    required: true
  model:
    description: Model name sent in requests (OpenAI APIs; see C(GET /v1/models)).
    type: str
    default: ""
  api:
    description:
      - C(openai_chat) (C(/v1/chat/completions)), C(openai_completions) (C(/v1/completions)) or
        C(sglang_generate) (SGLang's native C(/generate), per-chunk token counts from
        C(meta_info)).
      - The OpenAI APIs ask for C(stream_options.continuous_usage_stats) (SGLang, vLLM), which
        gives per-chunk token counts; servers that ignore it get inter-chunk ITL, labelled.
    type: str
    choices: [openai_chat, openai_completions, sglang_generate]
    default: openai_chat
  api_key:
    description: Bearer token, if the server wants one.
    type: str
  host_label:
    description: Host name recorded in every row (the action plugin sets the task's host).
    type: str
    default: localhost
  profile:
    description: Serving profile name recorded in every row.
    type: str
    default: default
  repeat:
    description:
      - Which measurement of the level this call makes (1 for the first), recorded in every row
        and request record (C(repeat)) and in the part file names. The action plugin sets it when
        it measures each level more than once (its option C(repeats), see the notes); a direct
        module call rarely needs it.
    type: int
    default: 1
  concurrency:
    description:
      - Closed loop (O(load_mode=concurrency)) the levels to run, each a number of workers.
      - Open loop (O(load_mode=rate)) the cap on requests in flight (first element).
      - The action plugin calls the module with one level at a time.
    type: list
    elements: int
    required: true
  load_mode:
    description: C(concurrency) (closed loop) or C(rate) (open loop, O(request_rate)).
    type: str
    choices: [concurrency, rate]
    default: concurrency
  request_rate:
    description: Open loop only, the levels to run in requests per second.
    type: list
    elements: float
  arrival:
    description:
      - Open loop arrivals, C(poisson), C(constant) (evenly spaced) or C(gamma) (gamma gaps of
        shape I(burstiness), as vLLM's bench serve C(--burstiness)).
    type: str
    choices: [poisson, constant, gamma]
    default: poisson
  burstiness:
    description:
      - With I(arrival=gamma), the gamma shape of the gaps between arrivals (0.05 to 100; their
        coefficient of variation is 1/sqrt(burstiness)). Below 1 burstier than Poisson, 1 as
        bursty as Poisson, above 1 smoother. Any other arrival needs it at 1.
    type: float
    default: 1.0
  workload:
    description:
      - "C({kind: builtin}) (20 coding/agentic prompts), C({kind: synthetic, input_tokens: 512,
        output_tokens: 256, count: 64, spread: 0, seed: 1}) (with ignore_eos) or
        C({kind: jsonl, path: /file/on/the/client.jsonl, limit: N}) (lines C({\"prompt\": ...})
        or C({\"messages\": [...]}), optional C(max_tokens)). C(type) is accepted for C(kind)."
      - "C({kind: sharegpt, path: ShareGPT.json, limit, output_tokens}): the first human turn is
        the prompt, the gpt answer's length its max_tokens (entries under 4 tokens skipped, as
        vLLM does)."
      - "C({kind: hf, path: file-or-dir | name: owner/name, split, revision, prompt_field,
        output_field}): rows of a JSON, JSONL, parquet or arrow file (parquet and arrow need
        pyarrow), a directory of them, or a dataset in the local Hugging Face cache; never the
        hub."
      - "C({kind: shared_prefix, groups: 8, prompts_per_group: 16, prefix_tokens,
        question_tokens, output_tokens}): groups sharing a system prefix, each prompt its own
        question (SGLang's generated-shared-prefix)."
      - "C({kind: multi_turn, path | conversations: 16, turns: 4, input_tokens,
        output_tokens}) and C({kind: trace, path: trace.jsonl, speedup: 1, timestamp_unit: ms})
        (Mooncake or Azure style C({timestamp, input_length, output_length}) lines) are refused
        until the load generator keeps their order (its C(WORKLOAD_HOOKS))."
      - "Kinds that ask for lengths take C(tokenizer) (a local C(tokenizer.json), read with the
        C(tokenizers) package, or a transformers tokenizer directory): input lengths are then
        exact; without it about one word per token. The row's C(prompt_token_source) says
        which."
    type: dict
    default: {kind: builtin}
  max_tokens:
    description: Output token limit per request (a prompt's own C(max_tokens) wins).
    type: int
    default: 256
  ignore_eos:
    description:
      - Ask the server to ignore end-of-sequence (fixed output lengths). C(ignore_eos) is not in
        the OpenAI API (vLLM, SGLang and the simulator honour it; others may refuse it).
      - C(true) sends it on every request, C(false) on none (a prompt's own flag included).
      - Unset, each prompt decides - synthetic prompts ask for it, a JSONL line may - except for
        a profile the run's manifest records as an external endpoint (the bench role's
        C(engine=external)), which gets none.
    type: bool
  extra_body:
    description: "Extra JSON fields merged into every request body (e.g. C({temperature: 0}))."
    type: dict
    default: {}
  level_seconds:
    description: Target length of each level's measurement window, in seconds.
    type: float
    default: 30
  warmup_requests:
    description:
      - Requests each worker completes before the window opens (closed loop), so the synchronized
        start and cold caches are excluded. Open loop, the total is this times the cap.
    type: int
    default: 1
  min_window_requests:
    description: Requests that must be sent inside the window before it may close (default C).
    type: int
  min_latency_samples:
    description:
      - Succeeded window requests the latency percentiles must come from; the window stays open
        until it has them (bounded by O(level_timeout)), else the level says it has fewer
        (C(latency_samples) below C(min_latency_samples)). C(0) sets no minimum.
    type: int
    default: 30
  max_requests:
    description: Close the window once this many requests were sent in it.
    type: int
  level_timeout:
    description:
      - Hard bound on one level (warmup + window + tail) in seconds. When half of it has passed the
        window closes regardless (flagged C(window_complete=false)).
    type: float
    default: 600
  stall_timeout:
    description: A request that receives nothing for this many seconds fails as stalled.
    type: float
    default: 120
  slo:
    description: SLOs in ms for goodput, any of C(ttft_ms), C(tpot_ms), C(e2e_ms).
    type: dict
    default: {}
  ci_batches:
    description: Batches the window is cut into for the 95% confidence interval (batch means).
    type: int
    default: 10
  percentiles:
    description:
      - Percentiles reported beside p50, p90 and p99 (always reported) of TTFT, TPOT, ITL and E2E,
        as vLLM's C(--metric-percentiles), e.g. C([95, 99.9]); each strictly between 0 and 100, each
        once. Each adds the columns C(ttft_p<q>_ms), C(tpot_p<q>_ms), C(itl_p<q>_ms) and
        C(e2e_p<q>_ms) (q written as vLLM writes it, C(95), C(99.9)) after the fixed columns,
        ordered by figure, then q. Exact, as the fixed percentiles.
    type: list
    elements: float
  target_ci_pct:
    description:
      - Adaptive precision; keep the window open until the 95% CI half-width of output tok/s is
        below this percentage of the mean (bounded by O(level_timeout)).
    type: float
  processes:
    description:
      - Client processes (forked, each with its own event loop and a share of the workers). C(0)
        (the default) picks them per level from the concurrency and the CPUs this process may use,
        so that no client process is the bottleneck.
    type: int
    default: 0
  drain_timeout:
    description:
      - After a level's tail was cancelled, wait up to this many seconds for the server to be idle
        again before the next level (its running and queued gauges on C(/metrics) at 0, else
        probe requests' TTFT back to the idle value; with O(server_metrics=false) it probes); the
        wait is recorded as C(drain_s) and C(drain_basis). C(0) does not wait. The last level is
        not drained (see O(drain_after)).
    type: float
    default: 30
  drain_after:
    description:
      - Drain after the last level of this call too, because another call runs the next level.
        The action plugin runs one level per module call and sets it on every level but the
        sweep's last; a direct module call rarely needs it.
    type: bool
    default: false
  ramp_seconds:
    description:
      - Closed loop, the worker starts are spread over this many seconds (workers that start
        together stay in lockstep when requests take equal time, and their sends then hit the
        server in bursts). Covered by the warmup.
    type: float
    default: 0.5
  socket_rcvbuf:
    description:
      - Receive buffer of each connection in bytes (C(0) = the OS default). A bounded buffer keeps
        a flood of chunks waiting in the server rather than in megabytes of kernel buffer between
        the server's write and the client's timestamp.
    type: int
    default: 65536
  seed:
    description: Seed for prompt order and Poisson arrivals.
    type: int
    default: 1
  per_chunk_usage:
    description: Ask OpenAI servers for usage on every chunk (C(continuous_usage_stats)).
    type: bool
    default: true
  rx_timestamps:
    description:
      - Which clock stamps a chunk's arrival. C(kernel) (Linux, plain HTTP) reads every socket
        with the kernel's receive timestamp of its last segment, so the time the event loop took
        to reach the socket is not in TTFT or ITL; C(user) takes the time at the read (HTTPS and
        other platforms always do). The level row's C(rx_timestamps) says which one was used.
    type: str
    choices: [kernel, user]
    default: kernel
  server_metrics:
    description: Sample the server's C(/metrics) through the level and report window figures.
    type: bool
    default: true
  results_dir:
    description:
      - Optional directory on the bench client where each level is also written
        (C(<host>__<profile>__c<C>.json) and C(.jsonl)).
    type: path
  return_requests:
    description: Return the per-request records (the action plugin needs them).
    type: bool
    default: true
  progress_file:
    description:
      - A file on the bench client that each level rewrites about once a second with its figures
        so far (seconds elapsed, phase, requests finished, output tokens; JSON, replaced
        atomically). The action plugin sets it when the bench client is the controller (a local
        connection) and prints a line from it during the level; unset, nothing is written.
    type: path
attributes:
  check_mode:
    support: full
    description: Validates every option and builds the workload; sends no load.
notes:
  - "Options of the action plugin only: C(run_id), C(results_root) (controller path, default
    C(<playbook_dir>/results)), C(stop_on_failure) (default true), C(profile_index) and
    C(profile_count) (where this sweep stands in the run: profile i of n, for the progress line),
    C(repeats) (default 1: how many times each level is measured, see below), C(settings) (a
    dict of these options, under the ones the task gives itself: the bench role passes
    C(lookup('servelab.serving.llm_bench_args')), its variables' options built once),
    C(capacity_search) (see below)."
  - "C(capacity_search) (a dict; the bench role's C(bench_capacity_search), tune.yml sets it per
    trial) replaces the listed levels by a search for the highest load that meets an SLO: each
    level chosen from the last by bracketing and bisection over the request rate (C(axis=rate),
    open loop, O(concurrency) one value, the cap in flight) or the concurrency, short levels
    (C(short_seconds)) while the bracket is wide, full ones (C(full_seconds)) to finish; no load is
    measured twice, a resumed sweep replays its kept levels, a search that cannot beat C(beat)
    stops early. Its outcome (status, bracket C(lo)/C(hi), C(score), the levels) is returned as
    C(capacity) and written to C(capacity/<host>__<profile>.json) in the run directory
    (docs/tune.md; the rule: plugins/plugin_utils/tune/capacity.py)."
  - "C(repeats: N) measures every level N times, in rounds: every level once (repeat 1), then
    every level again (repeat 2), and so on; each repeat is a whole level (warm-up, window,
    tail, and the drain before the next), sent with seed + repeat - 1, and written as its own
    part files (C(__rep<r>) added to the name from repeat 2 on) and rows (C(repeat)). Rounds
    rather than N back-to-back measurements of one level, so that drift over the run (clocks,
    heat, a neighbour's load) shows in each level's spread instead of biasing whole levels, and
    a run cut short has every level measured at least once. A resumed run keeps each finished
    repeat and measures only the missing ones."
  - "The window: it opens when every worker has finished O(warmup_requests) requests, lasts
    O(level_seconds) and at least O(min_window_requests) sends; the load stays on until every
    request sent in the window has finished (so all ran under full load); the tail requests still
    running are then cancelled and recorded as C(cancelled:)."
"""

EXAMPLES = r"""
- name: Sweep concurrency against the server (progress per level, results on the controller)
  llm_bench:
    base_url: "http://{{ bench_target_host }}:30000"
    model: "{{ bench_server.model }}"
    api: openai_chat
    profile: eagle3
    concurrency: [1, 2, 5, 10, 30, 70]
    run_id: "{{ bench_run_id }}"
    results_root: "{{ playbook_dir }}/results"
    workload: {kind: builtin}
    max_tokens: 512
    level_seconds: 20
    slo: {ttft_ms: 2000, tpot_ms: 100}
  delegate_to: "{{ bench_client }}"

- name: Open loop, Poisson arrivals at three rates, at most 256 in flight
  llm_bench:
    base_url: http://127.0.0.1:30000
    model: qwen
    load_mode: rate
    request_rate: [2, 4, 8]
    concurrency: [256]
    workload: {kind: synthetic, input_tokens: 1024, output_tokens: 256}
    run_id: rates-1
"""

RETURN = r"""
levels:
  description: One row per level; the columns of results.LEVEL_COLUMNS, then extra columns.
  returned: always
  type: list
  elements: dict
  sample:
    - {host: gpu1, profile: eagle3, concurrency: 5, requests: 120, errors: 0, window_s: 20.1,
       output_tok_s: 183.2, output_tok_s_ci95: 2.1, ttft_p50_ms: 61.0, tpot_p50_ms: 26.4,
       itl_basis: token, tokens_source: server, client_limited: false,
       server_metrics: {server_spec_accept_length_mean: 3.1}}
requests:
  description:
    - Per-request records (results.REQUEST_FIELDS plus queue_ms, phase, error_kind, ...), when
      return_requests.
    - Each carries its inter-token gaps, C(itl) (integer microseconds of each token-carrying chunk
      after the first, C(x<k>) after a chunk of k tokens, space-separated) and C(itl_basis)
      (C(token) or C(chunk)); see docs/results.md.
  returned: when return_requests
  type: list
  elements: dict
warnings_text:
  description:
    - Per-level notes (incomplete window, client-limited level, no server metrics).
    - Once per task, why C(levels.parquet) and C(requests.parquet) were not written, when pandas
      or pyarrow is missing from the Python that runs Ansible on the controller (with the
      command that installs them).
  returned: always
  type: list
  elements: str
exports:
  description:
    - The Parquet exports this task wrote or rewrote in the controller's run directory after its
      levels (C(levels.parquet), C(requests.parquet), the bytes M(servelab.serving.bench_report)
      writes), so a run measured without the report step has them. Empty when pandas or pyarrow
      is missing (see RV(warnings_text)) or nothing changed.
  returned: always (the action), not in check mode
  type: list
  elements: str
  sample: [levels.parquet, requests.parquet]
capacity:
  description:
    - The capacity search's outcome (the action, with C(capacity_search)) - C(status) (found,
      pruned, none_passed, at_maximum, max_levels, failed), C(reason), C(score) and its
      C(score_ci95), C(best_x) (the load of the score), the bracket C(lo)/C(hi), C(bound), the
      level counts and C(levels_measured); also written to C(capacity/<host>__<profile>.json).
  returned: with capacity_search (the action)
  type: dict
results_dir:
  description: Where the level files were written on the bench client (when results_dir).
  returned: when results_dir
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (  # noqa: E402
    BenchOptionsError, level_configs, run_levels,
)
# One spec for the module and its action plugin; its defaults are LevelConfig's.
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.options import (  # noqa: E402
    ARGUMENT_SPEC,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import write_level_files  # noqa: E402


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = dict(module.params)
    try:
        configs, workload = level_configs(params)
    except BenchOptionsError as exc:
        module.fail_json(msg=str(exc))
    if module.check_mode:
        module.exit_json(changed=False, levels=[], requests=[], warnings_text=[],
                         msg="check mode: %d level(s) validated, %s; no load sent"
                             % (len(configs), workload.description))
    try:
        outcome = run_levels(configs, workload, drain_last=params["drain_after"])
    except BenchOptionsError as exc:
        module.fail_json(msg=str(exc))
    result = dict(changed=False, levels=outcome.levels, warnings_text=outcome.warnings)
    if params["return_requests"]:
        result["requests"] = outcome.requests
    # An orphan (its caller gone) writes no part file: a cut-short level is not a finished one,
    # and resume must measure it again.
    if params["results_dir"] and not outcome.orphaned:
        directory = params["results_dir"]   # type path: already expanded
        for level, requests in zip(outcome.levels, outcome.requests_by_level):
            write_level_files(directory, level, requests)
        result["results_dir"] = directory
        result["changed"] = True
    if outcome.failure:
        # The failed level is in `levels` (with its errors); later levels were not run.
        module.fail_json(msg="%s; later levels not run" % outcome.failure, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
