"""The part of bench.yml's preflight that only a target can answer. Standard library only.

The controller (plugins/plugin_utils/preflight.py) checks every bench_* setting it can on its own;
two things live on other machines and are checked there, through the bench_preflight module,
before any server starts or any run directory exists:

- a jsonl workload is a file on the bench client: it is read and parsed there, by the very
  function llm_bench's module uses (loadgen/workloads.load), so "present and parseable" means
  what the sweep will see;
- an SGLang profile's command line depends on the release installed on the GPU server: it is
  rendered for that release and its flags checked against that release's own argument
  definitions, by the functions llm_server runs before a launch (server/manager.py), so the
  preflight and the start cannot disagree;
- a program a GPU server needs besides its engine (HAProxy for a router derived profile) must be
  an executable file there.
Nothing here starts a process other than the engine interpreter asked for its version, and
nothing writes a file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Mapping, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import (
    WorkloadError,
    load,
)
from ansible_collections.servelab.serving.plugins.module_utils.server import engine as server_engine
from ansible_collections.servelab.serving.plugins.module_utils.server import manager

# The ServerRequest fields a server check may set; everything else keeps llm_server's default.
SERVER_REQUEST_FIELDS = ("name", "engine", "profile", "model", "host", "port", "python", "env",
                         "state_dir")


@dataclass(frozen=True)
class TargetProblem:
    variable: str                 # the bench_* variable (or element) to fix
    message: str                  # the whole sentence: the variable, what is wrong, the fix
    hosts: Tuple[str, ...] = ()   # the GPU servers whose settings these are
    where: str = ""               # file:line of the value, as the controller found it

    def as_dict(self) -> dict:
        return {"variable": self.variable, "message": self.message, "hosts": list(self.hosts),
                "where": self.where}


def _problem(item: Mapping, variable: str, message: str) -> TargetProblem:
    return TargetProblem(variable, message, tuple(str(h) for h in (item.get("hosts") or ())),
                         str(item.get("where") or ""))


def _as_variable(message: str, variable: str, option: str) -> str:
    """`workload.path ...` -> `bench_workload.path ...`: the message names what the user sets."""
    if message.startswith(option):
        return variable + message[len(option):]
    return "%s: %s" % (variable, message)


def check_workload(item: Mapping) -> List[TargetProblem]:
    """Read the workload where the bench client will: a missing or unparseable file fails here."""
    variable = str(item.get("variable") or "bench_workload")
    try:
        load(dict(item.get("workload") or {}))
    except WorkloadError as exc:
        return [_problem(item, variable, _as_variable(str(exc), variable, "workload"))]
    except OSError as exc:   # unreadable (permissions, a directory): not a WorkloadError
        return [_problem(item, variable, "%s: cannot read workload.path %r on the bench client "
                                         "(%s)" % (variable, (item.get("workload") or {}).get("path"),
                                                   exc))]
    return []


def check_server(item: Mapping) -> List[TargetProblem]:
    """Render the profile for the engine installed here and check its flags, as llm_server will."""
    variable = str(item.get("variable") or "bench_profiles")
    raw: Mapping[str, Any] = item.get("request") or {}
    fields = {k: raw[k] for k in SERVER_REQUEST_FIELDS if raw.get(k) is not None}
    fields["env"] = {str(k): str(v) for k, v in (fields.get("env") or {}).items()}
    request = manager.ServerRequest(state="started", **fields)
    try:
        spec, _source = manager.build_spec(request)
        if request.engine == "sglang":
            # llm_server's own pre-launch check: unknown flags fail, deprecated ones only warn.
            manager._verify_installed_flags(request, spec)  # pylint: disable=protected-access
    except manager.ServerError as exc:
        if "rejects the rendered command" in exc.msg:
            # servelab's own flags are checked per release by the tests: an unknown one came
            # from the user.
            fix = "; correct or remove it in the profile's extra_args"
        else:
            fix = " (llm_server's python is bench_engine_python: %s)" % (
                request.python or "the module's interpreter")
        return [_problem(item, variable, "%s: %s%s" % (variable, exc.msg, fix))]
    if request.engine == "vllm":
        # vllm is launched as <dir of python>/vllm: without the package the start fails late.
        found = server_engine.installed_version(request.python or "python3", "vllm")
        if found.value is None:
            return [_problem(item, variable, "%s: %s; set bench_engine_python to the interpreter "
                                             "of vLLM's venv" % (variable, found.error))]
    return []


def check_executable(item: Mapping) -> List[TargetProblem]:
    """A program the run will start here ({variable, path, needed_for, fix}) is an executable
    file: a missing one would otherwise fail its profile after the other servers had run."""
    variable = str(item.get("variable") or "bench_profiles")
    path = str(item.get("path") or "")
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return []
    why = "not executable" if os.path.isfile(path) else "no such file"
    return [_problem(item, variable, "%s: %s on this host (%s), needed for %s; %s, or set %s to "
                                     "its path" % (variable, path or "''", why,
                                                   item.get("needed_for") or "this run",
                                                   item.get("fix") or "install it", variable))]


def run_checks(workloads: Sequence[Mapping], servers: Sequence[Mapping],
               executables: Sequence[Mapping] = ()) -> List[TargetProblem]:
    """Every problem, not the first: the user fixes them all in one go."""
    problems: List[TargetProblem] = []
    for item in workloads or ():
        problems += check_workload(item)
    for item in servers or ():
        problems += check_server(item)
    for item in executables or ():
        problems += check_executable(item)
    return problems
