"""What the load generator sends: prompts from a built-in coding/agentic set, synthetic prompts of
given lengths, a JSONL file, and the workloads users bring from vLLM's, SGLang's, guidellm's and
aiperf's benchmarks. Standard library only (a tokenizer or pyarrow only when asked for).

A workload is a dict (the `workload` option of llm_bench; `type` is accepted for `kind`):
  {kind: builtin}                                  the coding/agentic set below
  {kind: synthetic, input_tokens: 512, output_tokens: 256, count: 64, spread: 0.0, seed: 1}
  {kind: jsonl, path: /path/prompts.jsonl, limit: 1000}
      one JSON object per line: {"prompt": "..."} or {"messages": [...]}, optional "max_tokens"
  {kind: sharegpt, path: ShareGPT.json, limit, seed, output_tokens}    (datasets.py)
  {kind: hf, path: file-or-dir | name: owner/name, split, revision, prompt_field, output_field}
  {kind: shared_prefix, groups, prompts_per_group, prefix_tokens, question_tokens,
   output_tokens}                                                      (generated.py)
  {kind: multi_turn, path: conversations file | conversations, turns, input_tokens,
   output_tokens}                                                      (generated.py)
  {kind: trace, path: trace.jsonl, speedup: 1, timestamp_unit: ms}     (trace.py)
Every kind that asks for lengths takes `tokenizer` (a local tokenizer.json or transformers
directory, tokens.py): input lengths are then exact, else about one word per token; the level
row's `prompt_token_source` says which. Files are on the bench client and are read there, with
every prompt built before the level starts.
Synthetic prompts ask for exactly `output_tokens` with ignore_eos (SGLang and vLLM honour it), so
every request generates the same number of tokens; the server still reports what it generated.
ignore_eos is not in the OpenAI API: llm_bench's `ignore_eos: false` takes it off every prompt
(with_ignore_eos), for a server that refuses unknown fields.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import replace
from typing import Optional

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.prompts import (
    TOKENS_TEXT, Prompt, Workload, WorkloadError,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.datasets import from_rows
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.generated import (
    multi_turn, shared_prefix,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.tokens import (
    Counter, Words, filler_text, load_tokenizer,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.trace import from_trace

__all__ = ["FILE_KINDS", "LEVEL_HOOKS", "WORKLOAD_TYPES", "Prompt", "Workload", "WorkloadError",
           "builtin", "check_spec", "from_jsonl", "load", "missing_level_hook",
           "reads_client_files", "synthetic"]

WORKLOAD_TYPES = ("builtin", "synthetic", "jsonl", "sharegpt", "hf", "shared_prefix",
                  "multi_turn", "trace")
# Kinds that read files on the bench client (bench_preflight reads them there, as jsonl's).
FILE_KINDS = ("jsonl", "sharegpt", "hf", "multi_turn", "trace")

# The keys each kind takes (`kind` and its alias `type` aside).
_KEYS = {
    "builtin": (),
    "synthetic": ("input_tokens", "output_tokens", "count", "spread", "seed", "tokenizer"),
    "jsonl": ("path", "limit"),
    "sharegpt": ("path", "limit", "seed", "output_tokens", "ignore_eos", "tokenizer"),
    "hf": ("path", "name", "revision", "split", "limit", "seed", "prompt_field", "output_field",
           "output_tokens", "ignore_eos", "tokenizer"),
    "shared_prefix": ("groups", "prompts_per_group", "prefix_tokens", "question_tokens",
                      "output_tokens", "seed", "ignore_eos", "tokenizer"),
    "multi_turn": ("path", "conversations", "turns", "input_tokens", "output_tokens", "seed",
                   "ignore_eos", "tokenizer"),
    "trace": ("path", "limit", "speedup", "timestamp_unit", "seed", "ignore_eos", "tokenizer"),
}


def with_ignore_eos(workload: Workload, setting: Optional[bool]) -> Workload:
    """The workload as llm_bench's `ignore_eos` option leaves it: unset (None) or true keep each
    prompt's own flag (true adds it everywhere through LevelConfig.ignore_eos); false clears it on
    every prompt, so no request body carries the field. Runs once, before the level: the send
    path's request_body is untouched."""
    if setting is not False or not any(p.ignore_eos for p in workload.prompts):
        return workload
    return replace(workload, prompts=[replace(p, ignore_eos=False) for p in workload.prompts])


_SYSTEM = ("You are a senior software engineer working in a terminal-based coding agent. Answer "
           "with working code and short explanations.")

# Realistic coding and agentic requests of varied length (short questions, refactors with code,
# tool-use style transcripts). Lengths span roughly 20 to 900 tokens.
_SNIPPET_PY = '''
def load_config(path):
    f = open(path)
    data = f.read()
    cfg = {}
    for line in data.split("\\n"):
        if "=" in line:
            k, v = line.split("=")
            cfg[k.strip()] = v.strip()
    return cfg

def merge(a, b):
    for k in b:
        a[k] = b[k]
    return a
'''

_SNIPPET_GO = '''
func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
    body, _ := ioutil.ReadAll(r.Body)
    var req Request
    json.Unmarshal(body, &req)
    s.mu.Lock()
    s.cache[req.Key] = req.Value
    s.mu.Unlock()
    go s.persist(req)
    w.WriteHeader(200)
}
'''

_SNIPPET_TS = '''
export async function fetchAll(urls: string[]) {
  const results = [];
  for (const u of urls) {
    const r = await fetch(u);
    results.push(await r.json());
  }
  return results;
}
'''

_TRACE = '''Traceback (most recent call last):
  File "/srv/app/worker.py", line 88, in run
    batch = self.queue.get(timeout=5)
  File "/usr/lib/python3.11/queue.py", line 179, in get
    raise Empty
_queue.Empty

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/srv/app/main.py", line 41, in <module>
    pool.join()
  File "/srv/app/pool.py", line 23, in join
    w.result()
RuntimeError: worker 3 exited with code 137
'''

_AGENT_TRANSCRIPT = '''<tool_call>{"name": "run", "arguments": {"cmd": "pytest -q tests/test_api.py"}}
</tool_call>
<tool_result>
F..F.
FAILED tests/test_api.py::test_pagination - AssertionError: assert 20 == 25
FAILED tests/test_api.py::test_filter_by_date - KeyError: 'created_at'
2 failed, 3 passed in 0.84s
</tool_result>
<tool_call>{"name": "read_file", "arguments": {"path": "app/api.py", "lines": "40-80"}}</tool_call>
<tool_result>
40  def list_items(request):
41      page = int(request.args.get("page", 1))
42      size = int(request.args.get("size", 20))
43      items = db.query(Item).order_by(Item.id)
44      if "since" in request.args:
45          items = items.filter(Item.created >= parse(request.args["since"]))
46      return [i.to_dict() for i in items.offset(page * size).limit(size)]
</tool_result>
'''

_BUILTIN = [
    ("py-explain", "What does Python's `functools.lru_cache` do with keyword arguments? "
                   "Short answer."),
    ("regex", "Write a regular expression that matches ISO 8601 dates with optional time and "
              "timezone, and show three test cases."),
    ("bash-oneliner", "Give me a bash one-liner that finds the 10 largest files under the current "
                      "directory, human-readable sizes, excluding .git."),
    ("sql", "Table orders(id, customer_id, total, created_at). Write a PostgreSQL query for each "
            "customer's running total by month in 2024, with the month-over-month change."),
    ("refactor-py", "Refactor this Python for correctness and clarity (file handles, lines with "
                    "several '=' signs, comments, a merge that mutates its input). Keep the API.\n"
                    "```python" + _SNIPPET_PY + "```"),
    ("review-go", "Review this Go HTTP handler. List every bug and race you see, then give a "
                  "corrected version.\n```go" + _SNIPPET_GO + "```"),
    ("ts-concurrency", "Make this TypeScript fetch the URLs concurrently with a limit of 4 in "
                       "flight, with retries and a timeout per request.\n```ts" + _SNIPPET_TS
     + "```"),
    ("debug-trace", "Our worker pool crashes in production. Explain the likely cause from this "
                    "trace and how to fix it.\n```\n" + _TRACE + "```"),
    ("agent-fix-tests", "You are fixing failing tests in a repository. Here is the session so "
                        "far:\n" + _AGENT_TRANSCRIPT + "\nPropose the patch to app/api.py as a "
                        "unified diff and explain why each test failed."),
    ("unit-tests", "Write pytest unit tests for a function `slugify(text: str) -> str` that "
                   "lowercases, strips accents, replaces runs of non-alphanumerics with '-' and "
                   "trims dashes. Cover edge cases."),
    ("dockerfile", "Write a small multi-stage Dockerfile for a Python 3.11 FastAPI app using uv, "
                   "running as non-root, with a healthcheck."),
    ("k8s", "Write a Kubernetes Deployment and Service for a stateless API with 3 replicas, "
            "readiness and liveness probes, resource limits and a PodDisruptionBudget."),
    ("algorithm", "Implement an LRU cache in Rust with O(1) get and put, without unsafe code. "
                  "Explain the ownership choices."),
    ("ansible", "Write an Ansible task list that installs nginx on Debian, templates a site "
                "config, validates it with `nginx -t` before reload, and is idempotent."),
    ("git", "I committed a secret three commits ago on a branch I already pushed. Give the exact "
            "git commands to remove it from history and what my teammates must do."),
    ("perf", "A Python service spends 40% of CPU in json.dumps of large dicts. List concrete "
             "ways to reduce that, with the trade-offs, most effective first."),
    ("agent-plan", "You are an autonomous coding agent with tools read_file, write_file, run. "
                   "Task: add pagination to the /users endpoint of a Flask app with SQLAlchemy, "
                   "including tests. Write your step-by-step plan with the tool calls you would "
                   "make, then the code for the endpoint."),
    ("c-bug", "This C function sometimes crashes: `char *dup(const char *s){char *d=malloc("
              "strlen(s));strcpy(d,s);return d;}`. Why, and what is the fixed version?"),
    ("design", "Design the schema and API for a rate limiter shared by 20 stateless API servers "
               "(token bucket per API key, Redis available). Include the Lua script."),
    ("agent-logs", "As a coding agent you ran the test suite and the build. Summarise what "
                   "failed and fix it.\n" + _AGENT_TRANSCRIPT + "\n" + _TRACE
     + "\nThe build log also says: `warning: unused variable 'size'` in app/api.py line 42."),
]

# Words that are one token each in common BPE vocabularies (with their leading space).
_WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at "
          "which but have an they you were her she there their one all we can has been if more "
          "when will would who so no out up into do time only new some could these two may first "
          "then other than its also over after most made any where what such about many through "
          "before must between back years them used well way work people should because each "
          "just those how too little state good very make world still own see men long here get "
          "both under").split()
# Synthetic prompts use the three-letter ones: " the", " and", ... are one token in the common
# BPE vocabularies and exactly one under the simulator's rule (4 UTF-8 bytes per token), so
# `input_tokens` means the same to a real server and to the simulator.
_TOKEN_WORDS = tuple(w for w in _WORDS if len(w) == 3)


def builtin() -> Workload:
    prompts = [Prompt(messages=[{"role": "system", "content": _SYSTEM},
                                {"role": "user", "content": text}], label=label)
               for label, text in _BUILTIN]
    return Workload("builtin", prompts, "%d built-in coding/agentic prompts" % len(prompts),
                    token_source=TOKENS_TEXT)


def synthetic(input_tokens: int, output_tokens: int, count: int = 64, spread: float = 0.0,
              seed: int = 1, counter: Optional[Counter] = None) -> Workload:
    """Prompts of `input_tokens` tokens (exactly, with a tokenizer; else one common word per
    token, and the server reports the exact count) asking for exactly `output_tokens`
    (ignore_eos). Each prompt starts with a distinct number so prefix caching cannot serve one
    from another."""
    counter = counter or Words()
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        n_in = input_tokens
        n_out = output_tokens
        if spread:
            n_in = max(1, int(round(input_tokens * rng.uniform(1 - spread, 1 + spread))))
            n_out = max(1, int(round(output_tokens * rng.uniform(1 - spread, 1 + spread))))
        text, got = filler_text(counter, n_in, rng, _TOKEN_WORDS, head=str(rng.randrange(10 ** 6)))
        prompts.append(Prompt(messages=[{"role": "user", "content": text}],
                              max_tokens=n_out, ignore_eos=True, label="synthetic-%d" % i,
                              input_tokens=got))
    return Workload("synthetic", prompts, "%d synthetic prompts, %s%d in / %d out tokens%s" % (
        count, "" if counter.exact else "~", input_tokens, output_tokens,
        " (+-%d%%)" % int(spread * 100) if spread else ""), token_source=counter.source)


def from_jsonl(path: str, limit: Optional[int] = None) -> Workload:
    if not os.path.isfile(path):
        raise WorkloadError("workload.path %r: no such file on the bench client (give the path "
                            "of a JSONL file there)" % path)
    prompts = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise WorkloadError("workload.path %s line %d: not JSON (%s)"
                                    % (path, lineno, exc)) from exc
            if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
                messages = obj["messages"]
            elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                messages = [{"role": "user", "content": obj["prompt"]}]
            else:
                raise WorkloadError(
                    "workload.path %s line %d: expected {\"prompt\": str} or {\"messages\": "
                    "[...]}" % (path, lineno))
            max_tokens = obj.get("max_tokens")
            prompts.append(Prompt(messages=messages,
                                  max_tokens=int(max_tokens) if max_tokens else None,
                                  ignore_eos=bool(obj.get("ignore_eos", False)),
                                  label="%s:%d" % (os.path.basename(path), lineno)))
            if limit and len(prompts) >= limit:
                break
    if not prompts:
        raise WorkloadError("workload.path %s: no prompts in the file" % path)
    return Workload("jsonl", prompts, "%d prompts from %s" % (len(prompts), path),
                    token_source=TOKENS_TEXT)


def _positive_int(spec: dict, key: str, default=None) -> int:
    value = spec.get(key, default)
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise WorkloadError("workload.%s: expected a positive integer, got %r" % (key, value)) from None
    if value <= 0:
        raise WorkloadError("workload.%s: expected a positive integer, got %r" % (key, value))
    return value


def _fraction(spec: dict, key: str, default: float, low: float, high: Optional[float]) -> float:
    try:
        value = float(spec.get(key, default))
    except (TypeError, ValueError):
        value = float("nan")
    if not (value >= low and (high is None or value < high)):      # NaN fails both
        raise WorkloadError("workload.%s: expected a number %s %g%s, got %r" % (
            key, ">=" if low == 0 else ">", low, " and below %g" % high if high else "",
            spec.get(key)))
    return value


def _required(spec: dict, kind: str, keys, example: str) -> None:
    for key in keys:
        if key not in spec:
            raise WorkloadError("workload.%s is required for kind %s (e.g. %s)"
                                % (key, kind, example))
        spec[key] = _positive_int(spec, key)


def _bool(spec: dict, key: str, default: bool) -> bool:
    value = spec.get(key, default)
    if isinstance(value, str) and value.lower() in ("true", "yes", "false", "no"):
        return value.lower() in ("true", "yes")
    if not isinstance(value, bool):
        raise WorkloadError("workload.%s: expected true or false, got %r" % (key, value))
    return value


def check_spec(spec: Optional[dict]) -> dict:
    """Validate the workload option's shape, reading no file: the controller checks this before
    the first level, the bench client (where a workload's files live) then reads them in load()."""
    spec = dict(spec or {"kind": "builtin"})
    if "kind" in spec and "type" in spec and spec["kind"] != spec["type"]:
        raise WorkloadError("workload: give `kind` only (`type` is an alias), got kind=%r and "
                            "type=%r" % (spec["kind"], spec["type"]))
    kind = spec.pop("type", None) or spec.get("kind") or "builtin"
    spec["kind"] = kind
    if kind not in WORKLOAD_TYPES:
        raise WorkloadError("workload.kind %r: expected one of %s" % (kind,
                                                                      ", ".join(WORKLOAD_TYPES)))
    known = set(_KEYS[kind]) | {"kind"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise WorkloadError("workload: unknown key(s) %s for kind %s; known: %s" % (
            ", ".join(unknown), kind, ", ".join(sorted(known | {"type"}))))
    for key in ("limit", "output_tokens"):
        if kind in ("synthetic", "jsonl") or key not in spec:
            continue        # their own rules below, as before
        spec[key] = None if spec[key] in (None, "") else _positive_int(spec, key)
    if "seed" in _KEYS[kind] and kind not in ("sharegpt", "hf"):
        try:
            spec["seed"] = int(spec.get("seed", 1))
        except (TypeError, ValueError):
            raise WorkloadError("workload.seed: expected an integer, got %r"
                                % spec.get("seed")) from None
    if spec.get("tokenizer") is not None and not isinstance(spec["tokenizer"], str):
        raise WorkloadError("workload.tokenizer: expected a path (a tokenizer.json or a "
                            "transformers tokenizer directory), got %r" % (spec["tokenizer"],))
    if "ignore_eos" in spec:
        spec["ignore_eos"] = _bool(spec, "ignore_eos", False)
    if kind in ("jsonl", "sharegpt", "trace") and not spec.get("path"):
        raise WorkloadError("workload.path is required for kind %s (a %s on the bench "
                            "client)" % (kind, {"jsonl": "JSONL file of prompts",
                                                "sharegpt": "ShareGPT JSON file",
                                                "trace": "JSONL trace file"}[kind]))
    if kind == "synthetic":
        _required(spec, kind, ("input_tokens", "output_tokens"),
                  "input_tokens: 512, output_tokens: 256")
        spec["count"] = _positive_int(spec, "count", 64)
        spec["spread"] = _fraction(spec, "spread", 0.0, 0.0, 1.0)
    elif kind == "jsonl":
        spec["limit"] = _positive_int(spec, "limit") if spec.get("limit") else None
    if kind in ("sharegpt", "hf") and spec.get("seed") is not None:
        try:
            spec["seed"] = int(spec["seed"])
        except (TypeError, ValueError):
            raise WorkloadError("workload.seed: expected an integer (the usable entries are "
                                "shuffled with it before `limit`, as vLLM samples), got %r"
                                % spec["seed"]) from None
    if kind == "hf":
        if not spec.get("path") and not spec.get("name"):
            raise WorkloadError("workload.path or workload.name is required for kind hf (a "
                                "local file or directory, or owner/name in the local Hugging "
                                "Face cache)")
    elif kind == "shared_prefix":
        spec.setdefault("groups", 8)
        spec.setdefault("prompts_per_group", 16)
        _required(spec, kind, ("groups", "prompts_per_group", "prefix_tokens", "question_tokens",
                               "output_tokens"),
                  "prefix_tokens: 2048, question_tokens: 128, output_tokens: 256")
    elif kind == "multi_turn":
        if spec.get("path"):
            for key in ("conversations", "turns"):
                if spec.get(key) is not None:
                    spec[key] = _positive_int(spec, key)
        else:
            spec.setdefault("conversations", 16)
            spec.setdefault("turns", 4)
            _required(spec, kind, ("conversations", "turns", "input_tokens", "output_tokens"),
                      "path: conversations.json, or turns: 4, input_tokens: 128, "
                      "output_tokens: 128")
    elif kind == "trace":
        spec["speedup"] = _fraction(spec, "speedup", 1.0, 0.0, None)
        if spec["speedup"] == 0:
            raise WorkloadError("workload.speedup: expected a number > 0 (2 replays the trace "
                                "twice as fast), got 0")
        unit = spec.get("timestamp_unit", "ms")
        if unit not in ("s", "ms", "us"):
            raise WorkloadError("workload.timestamp_unit %r: expected s, ms or us (Mooncake "
                                "traces are in ms)" % (unit,))
        spec["timestamp_unit"] = unit
    if kind in ("shared_prefix", "trace", "multi_turn") and "ignore_eos" not in spec:
        # Generated lengths are asked for exactly, as synthetic's are; a multi-turn file's
        # answers are the dataset's, as sharegpt's.
        spec["ignore_eos"] = not (kind == "multi_turn" and spec.get("path"))
    return spec


# Kinds whose order the level must keep, and the hook of the load generator (level.py's
# WORKLOAD_HOOKS) that keeps it: trace arrivals at the trace's times (Workload.arrivals_s, through
# trace.TraceSchedule), multi-turn turns in order per worker (Workload.conversations, through
# generated.ConversationOrder). Without the hook a level would send them shuffled at the
# configured load: not what was asked, so the options are refused.
LEVEL_HOOKS = {"trace": "arrivals", "multi_turn": "conversations"}


def missing_level_hook(spec: dict, hooks) -> Optional[str]:
    """The error for a (checked) workload whose order this load generator cannot keep; None if
    it can (`hooks`: the level's WORKLOAD_HOOKS)."""
    hook = LEVEL_HOOKS.get(spec.get("kind"))
    if hook is None or hook in hooks:
        return None
    return ("workload.kind %s: this load generator cannot yet send a %s workload in its order "
            "(%s; the level's `%s` hook is not in this build), and would send its prompts "
            "shuffled instead; use kind %s meanwhile" % (
                spec["kind"], spec["kind"],
                "each request at its trace timestamp" if hook == "arrivals"
                else "each conversation's turns in order, the next after the previous answer",
                hook, "synthetic or sharegpt with load_mode: rate" if hook == "arrivals"
                else "sharegpt (first turns only)"))


def reads_client_files(spec: dict) -> bool:
    """Whether this (checked) workload reads files on the bench client: a data file, or a
    tokenizer. bench_preflight reads those there, before the first level."""
    return bool(spec.get("kind") in FILE_KINDS and (spec.get("path") or spec.get("name"))
                or spec.get("tokenizer"))


def load(spec: Optional[dict]) -> Workload:
    """Build the workload from the option dict, validating every field first. Every prompt is
    built here, before any level starts."""
    spec = check_spec(spec)
    kind = spec["kind"]
    if kind == "builtin":
        return builtin()
    if kind == "jsonl":
        return from_jsonl(str(spec["path"]), spec["limit"])
    counter = load_tokenizer(spec.get("tokenizer"))
    if kind == "synthetic":
        return synthetic(spec["input_tokens"], spec["output_tokens"], count=spec["count"],
                         spread=spec["spread"], seed=spec["seed"], counter=counter)
    if kind in ("sharegpt", "hf"):
        return from_rows(spec, counter, kind)
    if kind == "shared_prefix":
        return shared_prefix(counter, _TOKEN_WORDS, spec["groups"], spec["prompts_per_group"],
                             spec["prefix_tokens"], spec["question_tokens"],
                             spec["output_tokens"], spec["seed"], spec["ignore_eos"])
    if kind == "multi_turn":
        return multi_turn(spec, counter, _TOKEN_WORDS)
    return from_trace(spec, counter, _TOKEN_WORDS)
