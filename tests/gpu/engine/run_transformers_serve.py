"""A real engine on a GPU through llm_server's logic: `transformers serve` (continuous batching)
with a random-weight Llama built locally, started by the launcher (engine `command`), readiness by
a real generation, a short closed-loop sweep, stop, and GPU memory back (NVML).

Runs without Ansible or pytest (python3 with torch, transformers, psutil, nvidia-ml-py; the wheels
`transformers serve` needs come from fetch-wheels.sh). One command on the device machine:

  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && \
      python3 tests/gpu/engine/run_transformers_serve.py --out "$OUT/transformers-serve"

Writes <out>/summary.json and <out>/summary.md (and the server's log and state under <out>/state).
Exit status 0 when every check passed, 1 when one failed (the summary says which).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))        # tests/gpu: gpu_env
import gpu_env  # noqa: E402

os.environ.update(gpu_env.NO_MULTICAST_ENV)   # inherited by the engine and every GPU process here

gpu_env.use_module_utils()

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import atomic_write_json, atomic_write_text  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.server.manager import (ServerError, ServerRequest,  # noqa: E402
                                                          run)

SERVER_NAME = "transformers-serve"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--out", required=True, help="directory for summary.json / summary.md")
    p.add_argument("--model-dir", default="/tmp/model")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--levels", default="1,8,32,64")
    p.add_argument("--level-seconds", type=float, default=15.0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--memory-timeout", type=float, default=120.0)
    return p.parse_args(argv)


# --- GPU memory (NVML) --------------------------------------------------------------------------

def gpu_memory_mib():
    import pynvml
    pynvml.nvmlInit()
    try:
        used = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            used.append(round(pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2 ** 20))
        return used
    finally:
        pynvml.nvmlShutdown()


def wait_memory_back(baseline, timeout, slack_mib=256, poll=0.05):
    """Poll NVML until every GPU is within `slack_mib` of its baseline; (ok, seconds, last)."""
    t0 = time.monotonic()
    last = gpu_memory_mib()
    while True:
        if all(now <= base + slack_mib for now, base in zip(last, baseline)):
            return True, round(time.monotonic() - t0, 3), last
        if time.monotonic() - t0 > timeout:
            return False, round(time.monotonic() - t0, 3), last
        time.sleep(poll)
        last = gpu_memory_mib()


# --- the engine -----------------------------------------------------------------------------------

def build_model(model_dir, hidden, layers):
    if os.path.exists(os.path.join(model_dir, "config.json")):
        return f"reused {model_dir}"
    done = subprocess.run([sys.executable, os.path.join(HERE, "build_random_llm.py"), model_dir,
                           str(hidden), str(layers)], capture_output=True, text=True,
                          timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"build_random_llm.py failed: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def serve_command():
    exe = shutil.which("transformers")
    if exe:
        return [exe, "serve"]
    # The console script may be missing where transformers was installed with --target.
    return [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; "
                                  "sys.argv[0] = 'transformers'; main()", "serve"]


def server_request(args, state_dir, state="started"):
    profile = {
        "name": "transformers_serve",
        "model": args.model_dir,
        "command": serve_command() + ["{model}", "--continuous-batching", "--host", "{host}",
                                      "--port", "{port}"],
        # A real generation through the chat endpoint, not an open port.
        "ready": {"path": "/v1/chat/completions",
                  "body": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1}},
    }
    return ServerRequest(name=SERVER_NAME, state=state, engine="command", profile=profile,
                         host="127.0.0.1", port=args.port, state_dir=state_dir,
                         ready_timeout=args.ready_timeout, probe_timeout=120, stop_grace=20,
                         kill_timeout=20, port_timeout=30)


# --- load -----------------------------------------------------------------------------------------

def sweep(base_url, model, levels, seconds, max_tokens):
    """Closed-loop levels with servelab's load generator (loadgen.py)."""
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import builtin
    rows = []
    for c in levels:
        cfg = LevelConfig(base_url=base_url, model=model, api="openai_chat", concurrency=c,
                          max_tokens=max_tokens, level_seconds=seconds,
                          level_timeout=max(300.0, seconds * 20), server_metrics=False,
                          per_chunk_usage=False, host_label="device",
                          profile="transformers_serve", processes=1 if c <= 64 else 2)
        result = run_level(cfg, builtin())
        row = result.row_dict()
        row["warnings"] = result.warnings
        rows.append(row)
        print(f"C={c}: {row['requests']} requests, {row['errors']} errors, "
              f"{row['output_tok_s']} output tok/s, ttft p50 {row['ttft_p50_ms']} ms, "
              f"stop: {row['stop_reason']}, first error: {row['first_error']}", flush=True)
    return rows


# --- report ---------------------------------------------------------------------------------------

def markdown(summary):
    s = summary
    lines = ["# transformers serve through llm_server's launcher", "",
             f"- model: {s['model']} ({s['model_build']})",
             f"- command: `{s['start'].get('cmdline', '')}`",
             f"- cgroup: {s['start'].get('cgroup')} ({s['start'].get('cgroup_reason')})",
             f"- ready after {s['start'].get('ready_seconds')} s (a 1-token chat completion)",
             f"- second `started` with the same config: changed={s['idempotent'].get('changed')}"
             f" action={s['idempotent'].get('action')}",
             f"- GPU memory MiB: before {s['memory']['before']}, serving "
             f"{s['memory']['serving']}, after stop {s['memory']['after']} "
             f"(back in {s['memory']['seconds_to_baseline']} s)",
             f"- stop: {len(s['stop'].get('killed', []))} process(es) signalled, "
             f"{s['stop'].get('seconds')} s, port free: {s['stop'].get('port_free')}", "",
             "| C | requests | errors | output tok/s | ttft p50 ms | tpot p50 ms | e2e p50 ms | client limited |",
             "|---|---|---|---|---|---|---|---|"]
    for r in s["levels"]:
        lines.append(f"| {r['concurrency']} | {r['requests']} | {r['errors']} | "
                     f"{r['output_tok_s']} | {r['ttft_p50_ms']} | {r['tpot_p50_ms']} | "
                     f"{r['e2e_p50_ms']} | {r['client_limited']} |")
    lines += ["", "## checks", ""]
    lines += [f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in s["checks"].items()]
    if s.get("error"):
        lines += ["", "## error", "", "```", s["error"], "```"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    state_dir = os.path.join(out, "state")
    os.makedirs(state_dir, exist_ok=True)
    os.makedirs(os.path.expanduser("~/.cache/huggingface/hub"), exist_ok=True)  # else /v1/models 500
    levels = [int(c) for c in args.levels.split(",") if c.strip()]
    summary = {"model": args.model_dir, "levels": [], "start": {}, "idempotent": {},
               "stop": {}, "memory": {}, "checks": {}, "error": None,
               "load_generator": "servelab loadgen.py (closed loop)"}
    t0 = time.time()
    try:
        summary["model_build"] = build_model(args.model_dir, args.hidden, args.layers)
        summary["memory"]["before"] = gpu_memory_mib()
        start = run(server_request(args, state_dir))
        summary["start"] = start.as_dict()
        summary["checks"]["started and generated (readiness)"] = start.ready_seconds is not None
        summary["memory"]["serving"] = gpu_memory_mib()
        again = run(server_request(args, state_dir))
        summary["idempotent"] = {"changed": again.changed, "action": again.action}
        summary["checks"]["second start unchanged"] = again.changed is False
        summary["levels"] = sweep(start.base_url, start.model, levels, args.level_seconds,
                                  args.max_tokens)
        summary["checks"]["every level answered without errors"] = all(
            r["requests"] > 0 and r["errors"] == 0 for r in summary["levels"])
    except Exception as exc:   # noqa: BLE001 - recorded; the server is stopped below
        summary["error"] = getattr(exc, "msg", None) or f"{type(exc).__name__}: {exc}"
    finally:
        try:
            stop = run(server_request(args, state_dir, state="stopped"))
            summary["stop"] = dict(stop.stopped or {}, action=stop.action)
            # Nothing to stop is fine when the start failed (llm_server stopped it then).
            summary["checks"]["stop: no survivors, port free"] = stop.stopped is None or (
                not stop.stopped["survivors"] and stop.stopped["port_free"])
        except ServerError as exc:
            summary["stop"] = exc.details.get("stopped") or {}
            summary["checks"]["stop: no survivors, port free"] = False
            summary["error"] = (summary["error"] or "") + f"\nstop: {exc.msg}"
        if "before" in summary["memory"]:
            ok, seconds, after = wait_memory_back(summary["memory"]["before"], args.memory_timeout)
            summary["memory"].update(after=after, seconds_to_baseline=seconds if ok else None)
            summary["checks"]["GPU memory back to baseline (NVML)"] = ok
    summary["seconds"] = round(time.time() - t0, 1)
    summary["checks"]["no error"] = summary["error"] is None
    summary["ok"] = all(summary["checks"].values())
    atomic_write_json(os.path.join(out, "summary.json"), summary)
    atomic_write_text(os.path.join(out, "summary.md"), markdown(summary))
    print(markdown(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
