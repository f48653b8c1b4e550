"""The part of bench.yml's preflight that only a target can answer. Standard library only.

The controller (plugins/plugin_utils/preflight/) checks every bench_* setting it can on its own;
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
  an executable file there;
- every port the run will bind on a GPU server (bench_server_port, a router's two halves) must
  be free there: the process holding one is named.
Nothing here starts a process other than the engine interpreter asked for its version, and
nothing writes a file.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Any, List, Mapping, Sequence, Set, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import (
    WorkloadError,
    load,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc import tree as proc_tree
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import scan_processes
from ansible_collections.servelab.serving.plugins.module_utils.server import engine as server_engine
from ansible_collections.servelab.serving.plugins.module_utils.server import manager, ports
from ansible_collections.servelab.serving.plugins.module_utils.server.state import STATE_FILE

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


def _own_servers(state_dir: str) -> Set[int]:
    """Pids recorded in the state files of the state directory this run uses: a server of
    this state directory left by an earlier run (killed, interrupted) is the run's own, which
    its first reap ends; the run lock decides about another run that uses it right now."""
    pids: Set[int] = set()
    root = os.path.expanduser(state_dir or "")
    try:
        names = os.listdir(root) if root else []
    except OSError:
        return pids
    for name in names:
        try:
            with open(os.path.join(root, name, STATE_FILE), encoding="utf-8") as fh:
                pid = json.load(fh).get("pid")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(pid, int) and pid > 0:
            pids.add(pid)
    return pids


def check_port(item: Mapping) -> List[TargetProblem]:
    """A port the run will bind here ({variable, port, needed_for, state_dir}) is free: a
    process already listening on it would otherwise fail the server's start, after the run
    directory is made (or answer in its place). A listener of this state directory's own
    servers (an earlier run's leftover) is left to the run's reap and lock."""
    variable = str(item.get("variable") or "bench_server_port")
    try:
        port = int(item.get("port"))
    except (TypeError, ValueError):
        return []            # the controller's range check has said so
    holders = ports.listeners(port)
    if not holders and not ports.is_listening(port):
        return []
    own = _own_servers(str(item.get("state_dir") or ""))
    table = scan_processes(stat_only=True) if holders and own else {}
    foreign = {pid: cmd for pid, cmd in holders.items()
               if not own & ({pid} | set(proc_tree.ancestors(pid, table)))}
    if holders and not foreign:
        return []
    who = ", ".join(ports.describe(foreign)) if foreign else (
        "a process this user cannot see (run the preflight as root to name it)")
    return [_problem(item, variable, "%s: port %d on this host, needed for %s, is already in "
                                     "use by %s; stop that process or set %s to a free port"
                                     % (variable, port, item.get("needed_for") or "the server",
                                        who, variable))]


HELP_TIMEOUT = 180.0
_HELP_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def help_flags(argv: Sequence[str], timeout: float = HELP_TIMEOUT) -> Tuple[Set[str], str]:
    """The flags `argv --help` prints (its own argument definitions, whatever parser it uses:
    argparse, click, typer's boxes), and what went wrong ('' when it printed some)."""
    cmd = []
    for arg in argv:
        if "{" in arg:
            # a placeholder ({model}, {port}) is left out, and the option it is the value of
            if cmd and cmd[-1].startswith("-") and "=" not in cmd[-1]:
                cmd.pop()
            continue
        cmd.append(arg)
    cmd.append("--help")
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return set(), "%s could not run: %s" % (" ".join(cmd), exc)
    text = _ANSI.sub("", (done.stdout or "") + "\n" + (done.stderr or ""))
    found = set(_HELP_FLAG.findall(text))
    if not found:
        tail = " ".join(text.strip().splitlines()[-3:])[:300]
        return set(), "%s printed no flags (exit %s): %s" % (" ".join(cmd), done.returncode, tail)
    return found, ""


def check_help_flags(item: Mapping) -> List[TargetProblem]:
    """Every flag of item['flags'] is one the command knows: its own --help lists it (a
    boolean flag --x also as --no-x)."""
    variable = str(item.get("variable") or "tune_space")
    known, error = help_flags([str(a) for a in item.get("argv") or []])
    if error:
        return [_problem(item, variable, "%s: cannot check the flags against the command's own "
                                         "definitions: %s" % (variable, error))]
    missing = [f for f in item.get("flags") or () if str(f) not in known]
    if not missing:
        return []
    out = []
    for flag in missing:
        near = difflib.get_close_matches(str(flag), sorted(known), n=1)
        out.append(_problem(item, variable, "%s: %s is not a flag of the command (its --help "
                                            "lists no such option)%s" % (
                                                variable, flag,
                                                "; did you mean %s?" % near[0] if near else "")))
    return out


def run_checks(workloads: Sequence[Mapping], servers: Sequence[Mapping],
               executables: Sequence[Mapping] = (),
               ports_needed: Sequence[Mapping] = (),
               help_checks: Sequence[Mapping] = ()) -> List[TargetProblem]:
    """Every problem, not the first: the user fixes them all in one go."""
    problems: List[TargetProblem] = []
    for item in help_checks or ():
        problems += check_help_flags(item)
    for item in ports_needed or ():
        problems += check_port(item)
    for item in workloads or ():
        problems += check_workload(item)
    for item in servers or ():
        problems += check_server(item)
    for item in executables or ():
        problems += check_executable(item)
    return problems
