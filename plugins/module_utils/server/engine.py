"""The engine installed on the target: its version, and whether it knows the rendered flags.

Asked of the server's own interpreter without importing the engine (importing sglang pulls torch
and CUDA and takes seconds): importlib.metadata for the version, importlib.util.find_spec for
where its source lies, then server_argdefs reads the argument definitions from that source.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ansible_collections.servelab.serving.plugins.module_utils.server.argdefs import (
    FlagProblem,
    check_against,
    sglang_defs_from_site,
)

_VERSION_SNIPPET = ("import importlib.metadata as m, sys\n"
                    "print(m.version(sys.argv[1]))\n")
_SITE_SNIPPET = ("import importlib.util as u, os, sys\n"
                 "s = u.find_spec(sys.argv[1])\n"
                 "print(os.path.dirname(list(s.submodule_search_locations)[0]))\n")


@dataclass
class Probe:
    value: Optional[str]
    error: Optional[str]


def _ask(python: str, snippet: str, package: str, timeout: float = 60.0) -> Probe:
    try:
        done = subprocess.run([python, "-c", snippet, package], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        return Probe(None, f"interpreter {python} not found")
    except subprocess.TimeoutExpired:
        return Probe(None, f"{python} did not answer within {timeout:.0f} s")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return Probe(None, f"{package} is not installed for {python} ({last})")
    return Probe(done.stdout.strip(), None)


def installed_version(python: str, package: str) -> Probe:
    return _ask(python, _VERSION_SNIPPET, package)


def installed_site(python: str, package: str) -> Probe:
    return _ask(python, _SITE_SNIPPET, package)


def verify_sglang_flags(python: str, cmd: Sequence[str],
                        env: Sequence[str]) -> List[FlagProblem]:
    """Problems of the rendered command against the SGLang installed for `python`; [] if fine.
    An "unchecked" problem says why nothing could be checked (source not found or unknown)."""
    site = installed_site(python, "sglang")
    if site.value is None or not os.path.isdir(os.path.join(site.value, "sglang")):
        return [FlagProblem("unchecked", f"could not locate the installed sglang source: "
                                         f"{site.error or site.value}")]
    defs, env_names = sglang_defs_from_site(site.value)
    if not defs:
        return [FlagProblem("unchecked", f"no argument definitions found under "
                                         f"{site.value}/sglang (unknown layout)")]
    return check_against(cmd, env, defs, env_names)
