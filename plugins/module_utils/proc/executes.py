"""What a process executes, as opposed to what its command line merely mentions.

The reaper's patterns (proc/select.py) name servers: `-m sglang.launch_server`, `vllm serve`,
`<state_dir>/servelab-*/servelab_simulator.pyz`, `sglang::scheduler`. Matched against every word
of argv they also hit bystanders that only name the server: `tail -f .../servelab_simulator.pyz`,
`vim sglang/launch_server.py`, `grep vllm serve notes`, and the shell of
`bash -c "python .../servelab_simulator.pyz; sleep 900"` (the python child runs the server; the
shell only holds the text). So a pattern is matched against the executed view of argv:

- argv[0], the program (or the title setproctitle gave it: `sglang::scheduler_TP0`);
- for a Python interpreter: its options, then `-m <module>` or the script (argv[1] after the
  options) and the script's subcommand (`/venv/bin/python3 /venv/bin/vllm serve`: an entry
  point started through its shebang); `python -c <code>` executes no file: only `python -c`;
- for a shell: its script (`bash run.sh`), never a `-c` command string (a mention: the commands
  in it run as the shell's children, which are matched on their own);
- for any other program: a subcommand (`sglang serve`), a bare word right after argv[0]; a path
  or a file name there (`tail x.py`, `vim /notes`) is an operand, not what runs.

argv comes from ProcInfo.cmdline (argv joined by spaces), so an argument with a space in it
splits; the executed view only ever gets shorter than the command line by that, never longer.
Standard library only: this runs on the target host.
"""
from __future__ import annotations

import os
import re
from typing import List, Sequence

# python, python3, python3.12, python3.12d, pypy3: what a shebang or a launcher execs.
_PYTHON = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?[dmu]*$")
_SHELLS = frozenset(("sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox"))
# Python options that take a value (as the next argument, or glued: -Wignore).
_PY_VALUE_OPTS = frozenset("WX")
_PY_LONG_VALUE_OPTS = frozenset(("--check-hash-based-pycs",))
# Shell options that take a value (-o pipefail, -O extglob).
_SH_VALUE_OPTS = frozenset("oO")
# A subcommand: a bare word (`serve`, `TP0`), not a path or a file name.
_SUBCOMMAND = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def _python_view(argv: Sequence[str]) -> List[str]:
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        if arg.startswith("--"):
            i += 2 if arg in _PY_LONG_VALUE_OPTS else 1
            continue
        for pos, flag in enumerate(arg[1:], start=1):
            glued = arg[pos + 1:]
            if flag in ("m", "c"):
                if glued:
                    value_end = i + 1
                    view = list(argv[:i]) + ["-" + flag, glued]
                else:
                    value_end = i + 2
                    view = list(argv[:i]) + ["-" + flag] + list(argv[i + 1:i + 2])
                if flag == "c":                  # inline code: no file runs, only `python -c`
                    return list(argv[:i]) + ["-c"]
                return view + _subcommand(argv, value_end)
            if flag in _PY_VALUE_OPTS:
                i += 0 if glued else 1
                break
        i += 1
    if i >= len(argv):
        return list(argv)                        # the interactive interpreter
    return list(argv[:i + 1]) + _subcommand(argv, i + 1)


def _shell_view(argv: Sequence[str]) -> List[str]:
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg in ("-", "+") or not arg.startswith(("-", "+")):
            break
        if arg.startswith("--"):
            i += 1
            continue
        flags = arg[1:]
        if "c" in flags:                         # a command string: its commands are children
            return list(argv[:i + 1])
        i += 2 if flags[-1:] in _SH_VALUE_OPTS else 1
    return list(argv[:i + 1])


def _subcommand(argv: Sequence[str], at: int) -> List[str]:
    if at < len(argv) and _SUBCOMMAND.match(argv[at]):
        return [argv[at]]
    return []


def executed_argv(cmdline: str) -> List[str]:
    """The words of cmdline that say what the process executes (see the module doc)."""
    argv = cmdline.split()
    if not argv:
        return []
    prog = os.path.basename(argv[0])
    if _PYTHON.match(prog):
        return _python_view(argv)
    if prog in _SHELLS:
        return _shell_view(argv)
    return [argv[0]] + _subcommand(argv, 1)


def executed(cmdline: str) -> str:
    """executed_argv joined by spaces: the string the reaper's patterns are matched against."""
    return " ".join(executed_argv(cmdline))
