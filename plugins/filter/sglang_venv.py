# -*- coding: utf-8 -*-
"""Filters of role sglang's venvs built side by side: the name of a stack's venv, the rollback state
recorded before the first change, and what the rollback did, in words for the stack's report.

Pure functions (unit-tested in tests/unit/test_sglang_venv_filters.py).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re

from ansible.errors import AnsibleFilterError

STATE_KEYS = ("venv", "fact", "recorded")
VENV_KINDS = ("link", "dir", "absent")


def venv_name(pins, sglang_version, cuda_version, python="python3") -> str:
    """The directory name of the venv for exactly these pins: readable, and different whenever
    anything pip would install differently differs (a pin, an extra package, the interpreter).

    ['torch==2.14.1+cu130', 'sglang==0.5.23', ...], '0.5.23', '13.0' -> 'sglang-0.5.23-cu130-1a2b3c4d5e'
    """
    text = "\n".join(sorted(str(p).strip() for p in pins or [])) + "\npython=" + str(python)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
    tag = "cu" + str(cuda_version).replace(".", "")
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", str(sglang_version))
    return "sglang-%s-%s-%s" % (safe, tag, digest)


def rollback_state(content_b64, path="the rollback state file") -> dict:
    """The state role sglang recorded before its first change (slurp's base64 of the JSON file).
    A file that is not such a state is an error naming it: taking the host as it is now would
    "restore" whatever venv an interrupted run left selected."""
    try:
        state = json.loads(base64.b64decode(str(content_b64 or "")).decode("utf-8"))
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        state, error = None, str(exc)
    else:
        error = "not a mapping"
        if isinstance(state, dict):
            missing = [k for k in STATE_KEYS if k not in state]
            venv = state.get("venv")
            if missing:
                error = "missing %s" % ", ".join(missing)
            elif not isinstance(venv, dict) or venv.get("kind") not in VENV_KINDS:
                error = "venv is not a link, a directory or absent"
            elif venv["kind"] == "dir" and not venv.get("parked"):
                error = "a venv directory without the place it is kept at"
            elif venv["kind"] == "link" and not venv.get("link"):
                error = "a link without its target"
            else:
                error = ""
    if error:
        raise AnsibleFilterError(
            "%s is not a rollback state written by role sglang (%s). It would say which venv to go back to after an "
            "interrupted run: make the SGLang venv path the venv you want by hand, delete the file, then run again."
            % (path, error))
    return {k: state[k] for k in STATE_KEYS}


def _describe(venv, torch=None) -> str:
    venv = venv or {}
    kind = venv.get("kind")
    if kind == "absent":
        return "absent"
    what = "a link to %s" % venv.get("link") if kind == "link" else "the venv directory" if kind == "dir" else kind
    if torch:
        what += " (torch %s)" % torch
    return what


def rollback_outcome(restore, previous, venv_after, path, torch=None, removed=None) -> dict:
    """{text, restored}: what role sglang's rollback did to the venv servers run, for the stack's
    report (role cuda_toolkit's cuda_toolkit_rollback_others).

    restore: the registered venv_switch (state restored) result; previous: the recorded Previous
    ({kind, link, parked}); venv_after: venv_switch's `venv` after it; torch: torch's version in it;
    removed: the venvs directories the rollback removed (built by this or an interrupted run).
    """
    restore = restore or {}
    previous = previous or {}
    after = venv_after or {}
    gone = [str(p) for p in removed or []]
    tail = "; the venv%s built beside it removed (%s)" % ("s" if len(gone) > 1 else "", ", ".join(gone)) if gone else ""
    if restore.get("failed"):
        return {"restored": False,
                "text": "the SGLang venv %s could NOT be put back (%s): it is %s%s" % (
                    path, str(restore.get("msg") or "?").strip(), _describe(after, torch), tail)}
    kind = previous.get("kind")
    same = after.get("kind") == kind and (kind != "link" or after.get("link") == previous.get("link"))
    if not same:
        return {"restored": False,
                "text": "the SGLang venv %s is %s, NOT what it was before: %s%s" % (
                    path, _describe(after, torch), _describe(previous), tail)}
    how = "put back" if restore.get("changed") else "not touched"
    return {"restored": True,
            "text": "the SGLang venv %s %s: %s, as before%s" % (path, how, _describe(after, torch), tail)}


class FilterModule:
    def filters(self):
        return {
            "sglang_venv_name": venv_name,
            "sglang_rollback_state": rollback_state,
            "sglang_rollback_outcome": rollback_outcome,
        }
