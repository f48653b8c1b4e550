"""servelab simulator engine: an OpenAI/SGLang-compatible streaming LLM server on a timing model.

A package, Python standard library only (it imports nothing of the collection but netstamp).
llm_server ships it to the target as one zipapp (server/simulator_file.py builds it) and runs
`python3 servelab_simulator.pyz --port N --profile NAME ...`; it prints
`servelab-simulator listening on http://HOST:PORT` once it accepts connections.

Endpoints
    POST /v1/chat/completions, POST /v1/completions    OpenAI format, stream true/false, SSE
        `data: {...}` chunks, `data: [DONE]`; `stream_options.include_usage` adds a final chunk
        with `usage`; non-streamed responses always carry `usage`.
    POST /generate         SGLang native: {"text" | "input_ids", "sampling_params": {...},
        "stream": bool}; streamed chunks carry the cumulative `text` and `meta_info` with
        cumulative `completion_tokens` (and `spec_verify_ct` under speculation) like SGLang.
    GET /v1/models, /health, /health_generate (like SGLang: submits a 1-token generation and
    answers 200 once the scheduler emitted a token after the check began), /metrics
    (Prometheus, SGLang's metric names, label model_name), /server_info (alias
    /get_server_info: profile parameters, time_scale, version), /get_model_info.

Timing model (profiles `baseline`, `eagle3`, `baseline_cu128`, `eagle3_cu128`): continuous
batching. A scheduler loop runs steps; each step serves every running request (at most
`max_running`; the rest wait in a FIFO queue) and admits queued requests while their prompt
tokens fit the step's prefill budget (`max_prefill_tokens`) and the KV pool. One step lasts

    step_base_ms + step_per_req_ms * decoding + moe_ms * (1 - (1 - moe_token_share) ** routed)
    + prefill_per_token_ms * new_prompt_tokens                 (all divided by time_scale)

where `decoding` is the number of running requests that decode in the step and `routed` =
decoding + new_prompt_tokens. The `moe_ms` term is the MoE expert weights a step reads: one token
touches a share of the experts and a batch re-uses them, so the per-request cost falls as the
batch grows. Without it no linear model fits the field data (see profiles._FIT). A newly
admitted request emits its first token at the end of its prefill step; a decoding request emits
1 token per step, or under speculation a draw of the accepted length (1 + the run of accepted
draft tokens, each accepted with `spec_accept_rate`, at most `spec_num_steps`): multi-token
chunks. Each request also spends `request_overhead_ms` (times 1 +- request_overhead_jitter,
seeded) outside the batch before it can be admitted (HTTP, tokenizer, detokenizer, client
turnaround in the field's setup): it delays the request but not the others. Draws are seeded by
`--seed` and the request's arrival number, so a run repeats.

The serving flags a tuner searches act on this model as stated in effects.py and
docs/simulator.md ("The searched flags"): --chunked-prefill-size (a prompt prefilled over
several steps), --mixed-chunk (false: a prefill step runs no decode), --cuda-graph-max-bs
(a larger decode batch runs eager, its fixed step cost times --cuda-graph-eager-factor),
--mem-fraction-static (the KV pool; a request is admitted only while its prompt and output
fit), and EAGLE's --spec-num-steps / --spec-eagle-topk / --spec-num-draft-tokens (the accepted
length and the step cost). At their defaults the fitted model is unchanged.

Test profiles: `fixed` (the first chunk exactly `ttft_ms` after the request, then one chunk every
`step_ms`; no batch, no queue) and `firehose` (writes chunks as fast as the loop allows, yielding
to the loop between writes, `firehose_events_per_write` SSE events per write).
`--tokens-per-chunk K` forces K tokens in every chunk, in any profile.

Tokens: prompt tokens = ceil(utf8 bytes / 4) of the prompt text (for chat: of all message
contents together; role names and template are not counted); `input_ids` count one each. Every
generated token is 4 bytes of ASCII text, so the same rule counts completions back. Output
length: exactly max_tokens with `ignore_eos` (or min_tokens >= max_tokens); otherwise a natural
length drawn from a log-normal (`natural_len_median`, `natural_len_sigma`) seeded by a hash of
the prompt and `--seed`, at least min_tokens, capped at max_tokens.

`time_scale` divides every model duration (the model runs that many times faster than real
time); fault knobs (`--stall-ms`, `--startup-delay`) are wall-clock.

Truth (`--truth-log PATH`): one JSON line per finished request (id also in the response `id`,
`meta_info.id` and the X-Request-Id header), with server CLOCK_MONOTONIC times in ns: t_recv_ns
(request body complete: when the server's event loop read it), t_arrive_ns (when the segment
that completed the request reached the server's socket: the kernel's receive stamp on Linux,
SO_TIMESTAMPNS; elsewhere, or where the stamp is unusable, the read time; `arrive_basis` says
which: kernel, read), chunk_ns and chunk_tokens (one entry per SSE event that carries
tokens), t_admit_ns (admitted to the batch), t_first_ns, t_last_ns, prompt_tokens,
completion_tokens, finish_reason, error (null or text), malformed_chunks, stalled_ms.
Buffered; flushed at least every second and at shutdown (SIGTERM/SIGINT).

Fault knobs: --die-after N (exit code 3, connections reset, right after the N-th generation
request sent its first chunk), --error-rate P (HTTP 500, or for a stream: an error event after
half the tokens then [DONE]), --stall-every N --stall-ms M (every N-th request stops emitting
for M ms after half its tokens), --malformed-every N (every N-th streamed request gets one
broken JSON event after its first chunk), --startup-delay S (503 from /health,
/health_generate and generation requests for S seconds), --abort-delay-ms M (a client that
disconnects mid-request is noticed M wall-clock ms late: its request keeps generating, holds its
batch slot and stays in `num_running_reqs` until then, as on a server whose abort arrives late;
0, the default, cancels it at once).

predict_level() and predict_crossover() give the model's closed-loop steady state from a fast
discrete-event simulation of the same scheduler logic with the same seeded draws (des.py; not
the live server; deterministic); runs.predict_run (controller side, not in the zipapp) predicts a
closed- or open-loop level request by request, for the tuner.
`python3 servelab_simulator.pyz --fit-report` prints the fit against the field data with its
residuals.

Modules: profiles (SimProfile, the fitted profiles, their checks), effects (the searched flags'
effects, the step formula), tokens (token rules), requests (parsing, SimRequest, seeded draws),
admission (the one admission rule and prefill plan), des (the discrete-event engine), predictor
(predict_level, the fit report), truth (truth log, counters), listener and protocol (stamped
sockets, HTTP), server and emission (SimServer), cli (the command line); controller side, not
shipped: runs (predict_run), knobs (SGLang's flags in the simulator's terms).
"""
