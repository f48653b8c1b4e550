"""What the load generator sends: prompts from a built-in coding/agentic set, synthetic prompts of
given lengths, or a JSONL file. Standard library only.

A workload is a dict (the `workload` option of llm_bench; `type` is accepted for `kind`):
  {kind: builtin}                                  the coding/agentic set below
  {kind: synthetic, input_tokens: 512, output_tokens: 256, count: 64, spread: 0.0, seed: 1}
  {kind: jsonl, path: /path/prompts.jsonl, limit: 1000}
      one JSON object per line: {"prompt": "..."} or {"messages": [...]}, optional "max_tokens"
Synthetic prompts ask for exactly `output_tokens` with ignore_eos (SGLang and vLLM honour it), so
every request generates the same number of tokens; the server still reports what it generated.
ignore_eos is not in the OpenAI API: llm_bench's `ignore_eos: false` takes it off every prompt
(with_ignore_eos), for a server that refuses unknown fields.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

WORKLOAD_TYPES = ("builtin", "synthetic", "jsonl")


class WorkloadError(ValueError):
    """Bad workload options: the message names the field and the fix."""


@dataclass
class Prompt:
    messages: List[Dict[str, str]]
    max_tokens: Optional[int] = None      # per-prompt override of the max_tokens option
    ignore_eos: bool = False
    label: str = ""

    @property
    def text(self) -> str:
        """Plain text for APIs without chat templates (/v1/completions, SGLang /generate)."""
        return "\n\n".join(m.get("content", "") for m in self.messages)


@dataclass
class Workload:
    kind: str
    prompts: List[Prompt] = field(default_factory=list)
    description: str = ""


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
    return Workload("builtin", prompts, "%d built-in coding/agentic prompts" % len(prompts))


def synthetic(input_tokens: int, output_tokens: int, count: int = 64, spread: float = 0.0,
              seed: int = 1) -> Workload:
    """Prompts of about `input_tokens` tokens (one common word per token; the server reports the
    exact count) asking for exactly `output_tokens` (ignore_eos). Each prompt starts with a
    distinct number so prefix caching cannot serve one from another."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        n_in = input_tokens
        n_out = output_tokens
        if spread:
            n_in = max(1, int(round(input_tokens * rng.uniform(1 - spread, 1 + spread))))
            n_out = max(1, int(round(output_tokens * rng.uniform(1 - spread, 1 + spread))))
        words = [str(rng.randrange(10 ** 6))]
        words.extend(rng.choice(_TOKEN_WORDS) for _word in range(max(0, n_in - 1)))
        prompts.append(Prompt(messages=[{"role": "user", "content": " ".join(words)}],
                              max_tokens=n_out, ignore_eos=True, label="synthetic-%d" % i))
    return Workload("synthetic", prompts, "%d synthetic prompts, ~%d in / %d out tokens%s" % (
        count, input_tokens, output_tokens, " (+-%d%%)" % int(spread * 100) if spread else ""))


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
    return Workload("jsonl", prompts, "%d prompts from %s" % (len(prompts), path))


def _positive_int(spec: dict, key: str, default=None) -> int:
    value = spec.get(key, default)
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise WorkloadError("workload.%s: expected a positive integer, got %r" % (key, value)) from None
    if value <= 0:
        raise WorkloadError("workload.%s: expected a positive integer, got %r" % (key, value))
    return value


def check_spec(spec: Optional[dict]) -> dict:
    """Validate the workload option's shape, reading no file: the controller checks this before
    the first level, the bench client (where a jsonl file lives) then reads the file in load()."""
    spec = dict(spec or {"kind": "builtin"})
    if "kind" in spec and "type" in spec and spec["kind"] != spec["type"]:
        raise WorkloadError("workload: give `kind` only (`type` is an alias), got kind=%r and "
                            "type=%r" % (spec["kind"], spec["type"]))
    kind = spec.pop("type", None) or spec.get("kind") or "builtin"
    spec["kind"] = kind
    if kind not in WORKLOAD_TYPES:
        raise WorkloadError("workload.kind %r: expected one of %s" % (kind,
                                                                      ", ".join(WORKLOAD_TYPES)))
    known = {"kind", "input_tokens", "output_tokens", "count", "spread", "seed", "path", "limit"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise WorkloadError("workload: unknown key(s) %s; known: %s" % (
            ", ".join(unknown), ", ".join(sorted(known | {"type"}))))
    if kind == "synthetic":
        for key in ("input_tokens", "output_tokens"):
            if key not in spec:
                raise WorkloadError("workload.%s is required for kind synthetic (e.g. "
                                    "input_tokens: 512, output_tokens: 256)" % key)
            spec[key] = _positive_int(spec, key)
        spec["count"] = _positive_int(spec, "count", 64)
        try:
            spread = float(spec.get("spread", 0.0))
        except (TypeError, ValueError):
            spread = -1.0
        if not 0.0 <= spread < 1.0:
            raise WorkloadError("workload.spread: expected a fraction in [0, 1), got %r"
                                % spec.get("spread"))
        spec["spread"] = spread
        spec["seed"] = int(spec.get("seed", 1))
    elif kind == "jsonl":
        if not spec.get("path"):
            raise WorkloadError("workload.path is required for kind jsonl (a JSONL file of "
                                "prompts on the bench client)")
        spec["limit"] = _positive_int(spec, "limit") if spec.get("limit") else None
    return spec


def load(spec: Optional[dict]) -> Workload:
    """Build the workload from the option dict, validating every field first."""
    spec = check_spec(spec)
    if spec["kind"] == "builtin":
        return builtin()
    if spec["kind"] == "synthetic":
        return synthetic(spec["input_tokens"], spec["output_tokens"], count=spec["count"],
                         spread=spec["spread"], seed=spec["seed"])
    return from_jsonl(str(spec["path"]), spec["limit"])
