"""llm_bench against a server that accepts only OpenAI's request fields (issue 28, item 1).

`transformers serve` answers a request with a field outside the OpenAI API with
`HTTP 422 {"detail":"Unexpected fields in the request: {'ignore_eos'}"}`. The server below (run as
a script: `python tests/unit/test_loadgen_strict_server.py --port 0 [--model NAME]`, standard
library only; tests/integration/test_bench_external.py runs bench.yml against it too) does
exactly that, and streams a plain OpenAI answer otherwise. The tests show that
`ignore_eos: false` keeps the field out of every request (synthetic prompts ask for it), and that
a refusal is named in the level's failure with the setting that drops the field.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# What the OpenAI API accepts (chat and completions): anything else is refused.
OPENAI_FIELDS = frozenset((
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream",
    "stream_options", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user", "tools",
    "tool_choice", "response_format", "echo", "suffix", "best_of",
))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args):      # quiet: the test reads only the listening line
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [
                {"id": self.server.model, "object": "model"}]}).encode())
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self):
        data = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        unexpected = set(data) - OPENAI_FIELDS
        if unexpected:
            # transformers serve's own words (a Python set's repr)
            detail = "Unexpected fields in the request: %s" % (unexpected,)
            self._send(422, json.dumps({"detail": detail}).encode())
            return
        n = int(data.get("max_tokens") or 8)
        chat = self.path.endswith("/chat/completions")
        events = []
        for i in range(n):
            choice = ({"index": 0, "delta": {"content": "t%d " % i}, "finish_reason": None}
                      if chat else {"index": 0, "text": "t%d " % i, "finish_reason": None})
            events.append({"id": "x", "choices": [choice]})
        events.append({"id": "x", "choices": [], "usage": {
            "prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}})
        body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
        self._send(200, body + b"data: [DONE]\n\n", "text/event-stream")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="m", help="the model GET /v1/models lists")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.model = args.model
    print("strict-openai listening on http://127.0.0.1:%d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
    sys.exit(0)

# ---------------------------------------------------------------------------------------------
# the tests (pytest imports this file; the server above runs only as a script)

import pytest  # noqa: E402

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (  # noqa: E402
    level_configs, run_levels,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import (  # noqa: E402
    request_body,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import (  # noqa: E402
    Prompt, load, with_ignore_eos,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (  # noqa: E402
    level_verdict, refused_fields,
)
from simproc import ServerProcess  # noqa: E402

STRICT = os.path.abspath(__file__)
SYNTHETIC = {"kind": "synthetic", "input_tokens": 16, "output_tokens": 6, "count": 4}


@pytest.fixture(scope="module")
def strict():
    with ServerProcess(script=STRICT) as srv:
        yield srv


def params(url, **kw):
    out = dict(base_url=url + "/v1", model="m", concurrency=[1], workload=SYNTHETIC,
               max_tokens=6, level_seconds=0.3, level_timeout=30, min_latency_samples=0,
               warmup_requests=1, drain_timeout=0, server_metrics=False)
    out.update(kw)
    return out


def sweep(url, **kw):
    configs, workload = level_configs(params(url, **kw))
    return run_levels(configs, workload)


def test_ignore_eos_false_sends_no_request_the_field_and_a_strict_server_serves_them(strict):
    outcome = sweep(strict.url, ignore_eos=False, per_chunk_usage=False)
    assert outcome.failure is None, outcome.failure
    row = outcome.levels[0]
    assert row["requests"] > 0 and row["errors"] == 0
    assert level_verdict(row).usable


def test_a_refused_field_fails_the_level_naming_the_field_and_the_setting(strict):
    # Unset: the synthetic prompts ask for ignore_eos, as before; the server refuses it.
    outcome = sweep(strict.url, per_chunk_usage=False)
    assert outcome.failure is not None
    assert "Unexpected fields in the request" in outcome.levels[0]["first_error"]
    assert "the server refuses the request field ignore_eos" in outcome.failure
    assert "set bench_ignore_eos: false" in outcome.failure


def test_a_refused_extra_body_field_names_bench_extra_body(strict):
    outcome = sweep(strict.url, ignore_eos=False, per_chunk_usage=False,
                    extra_body={"top_k": 5})
    assert "the server refuses the request field top_k" in outcome.failure
    assert "drop top_k from bench_extra_body" in outcome.failure


def test_ignore_eos_false_clears_every_prompts_flag_and_unset_keeps_it():
    synthetic = load(SYNTHETIC)
    assert all(p.ignore_eos for p in synthetic.prompts)
    assert not any(p.ignore_eos for p in with_ignore_eos(synthetic, False).prompts)
    assert with_ignore_eos(synthetic, None) is synthetic
    assert with_ignore_eos(synthetic, True) is synthetic
    configs, workload = level_configs(params("http://127.0.0.1:1", ignore_eos=False))
    assert not configs[0].ignore_eos and not any(p.ignore_eos for p in workload.prompts)
    configs, _loaded = level_configs(params("http://127.0.0.1:1", workload={"kind": "builtin"},
                                            ignore_eos=True))
    assert configs[0].ignore_eos


def test_the_body_carries_no_field_outside_openai_unless_asked():
    p = Prompt(messages=[{"role": "user", "content": "hi"}])
    body = json.loads(request_body("openai_chat", "m", p, 7, False, per_chunk_usage=False))
    assert set(body) <= OPENAI_FIELDS and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("error, fields", [
    ("HTTP 422: {\"detail\":\"Unexpected fields in the request: {'ignore_eos'}\"}",
     ("ignore_eos",)),
    ('HTTP 422: {"detail":[{"type":"extra_forbidden","loc":["body","ignore_eos"],'
     '"msg":"Extra inputs are not permitted"}]}', ("ignore_eos",)),
    ('HTTP 400: {"error":{"message":"Unrecognized request argument supplied: ignore_eos"}}',
     ("ignore_eos",)),
    ("HTTP 400: unknown field `top_k`, expected one of `model`", ("top_k",)),
    ("HTTP 500: Unexpected fields in the request: {'ignore_eos'}", ()),   # not a refusal
    ("connection refused", ()),
])
def test_refused_fields_reads_the_common_servers_words(error, fields):
    assert refused_fields(error) == fields


def test_the_action_tells_an_external_profile_from_the_runs_manifest(tmp_path):
    from ansible_collections.servelab.serving.plugins.action.llm_bench import ActionModule

    args = {"profile": "prod", "host_label": "gpu1"}
    assert not ActionModule._external(str(tmp_path), args)          # no manifest yet
    (tmp_path / "manifest.json").write_text(json.dumps({"profiles": {
        "prod": {"gpu1": {"engine": "external"}}, "sim": {"gpu1": {"engine": "simulator"}}}}))
    assert ActionModule._external(str(tmp_path), args)
    assert not ActionModule._external(str(tmp_path), dict(args, profile="sim"))
    assert not ActionModule._external(str(tmp_path), dict(args, host_label="gpu2"))
