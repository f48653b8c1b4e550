# -*- coding: utf-8 -*-
"""Filters of role cuda_toolkit: the target toolkit from a version, the driver floor, apt's install
plan, update-alternatives' answer, the verify checks, and the before/after table of the stack.

Pure functions (unit-tested in tests/unit/test_cuda_toolkit_filters.py); the role's tasks stay
declarative and every failure message is written here once.
"""
from __future__ import annotations

import base64
import binascii
import json
import re

from ansible.errors import AnsibleFilterError

from ansible_collections.servelab.serving.plugins.module_utils.apt.probe import apt_reason

VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
REVISION_RE = re.compile(r"^[0-9][0-9A-Za-z.+~]*$")
NVCC_RE = re.compile(r"release\s+(\d+\.\d+),\s*V([\d.]+)")


def _version_tuple(version) -> tuple:
    return tuple(int(part) for part in re.findall(r"\d+", str(version)))


def target(version, revision="1", root="/usr/local") -> dict:
    """cuda_toolkit_version X.Y.Z -> what to install and select.

    13.0.1 -> package cuda-toolkit-13-0, pinned 13.0.1-1, in /usr/local/cuda-13.0.
    """
    version = str(version).strip()
    match = VERSION_RE.match(version)
    if not match:
        raise AnsibleFilterError(
            "cuda_toolkit_version: %r is not a full toolkit version X.Y.Z (e.g. 13.0.1): the package "
            "cuda-toolkit-X-Y is pinned to exactly that release" % version)
    revision = str(revision).strip()
    if not REVISION_RE.match(revision):
        raise AnsibleFilterError(
            "cuda_toolkit_package_revision: %r is not a Debian revision (NVIDIA's packages use 1, "
            "as in cuda-toolkit-13-0=13.0.1-1)" % revision)
    major, minor, _patch = match.groups()
    release = "%s.%s" % (major, minor)
    package = "cuda-toolkit-%s-%s" % (major, minor)
    package_version = "%s-%s" % (version, revision)
    return {
        "version": version,
        "release": release,
        "major": major,
        "package": package,
        "package_version": package_version,
        "spec": "%s=%s" % (package, package_version),
        "path": "%s/cuda-%s" % (str(root).rstrip("/"), release),
    }


def driver_problem(facts, toolkit, floors, host="the container") -> str:
    """'' when the driver seen in the container meets the floor of the toolkit's major, else why not."""
    floors = {str(k): str(v) for k, v in (floors or {}).items()}
    major = str(toolkit["major"])
    if major not in floors:
        known = ", ".join(sorted(floors)) or "none"
        return ("cuda_toolkit_driver_floor has no entry for CUDA %s (it has %s): add the lowest driver "
                "branch CUDA %s supports, e.g. {'%s': '580'}" % (major, known, major, major))
    floor = floors[major]
    driver = (facts or {}).get("driver_version")
    if not driver:
        reason = (facts or {}).get("reason") or "no driver version found"
        return ("CUDA %s needs an NVIDIA driver >= %s, but %s sees no driver (%s). Pass the GPUs through "
                "first (playbooks/proxmox.yml), or set cuda_toolkit_check_driver: false to install the "
                "toolkit without a GPU." % (toolkit["version"], floor, host, reason))
    if _version_tuple(driver) < _version_tuple(floor):
        return ("NVIDIA driver %s on %s is too old for CUDA %s: CUDA %s.x needs driver >= %s "
                "(cuda_toolkit_driver_floor['%s']). Upgrade the Proxmox host's driver to the %s branch or "
                "newer (and the container's user-space driver to the same version), then run again. "
                "Nothing was changed." % (driver, host, toolkit["version"], major, floor, major, floor))
    return ""


def apt_plan(simulation_stdout) -> list:
    """Package names apt would install or upgrade, from `apt-get install -s` output ("Inst <name> ...")."""
    names = []
    for line in str(simulation_stdout or "").splitlines():
        match = re.match(r"^Inst\s+(\S+)", line)
        if match:
            names.append(match.group(1))
    return names


def forbidden(names, patterns) -> list:
    """Names matching any of the regexes (driver packages that must not enter a container)."""
    try:
        compiled = [re.compile(p) for p in patterns or []]
    except re.error as err:
        raise AnsibleFilterError("cuda_toolkit_forbidden_packages: %r is not a regular expression: %s"
                                 % (getattr(err, "pattern", "?"), err)) from err
    return [name for name in names or [] if any(p.search(name) for p in compiled)]


def alternative(query_stdout) -> dict:
    """`update-alternatives --query <name>` -> {status, value, paths: {path: priority}}."""
    info = {"status": None, "value": None, "paths": {}}
    current = None
    for line in str(query_stdout or "").splitlines():
        key, _colon, value = line.partition(":")
        value = value.strip()
        if key == "Status":
            info["status"] = value
        elif key == "Value":
            info["value"] = None if value in ("", "none") else value
        elif key == "Alternative":
            current = value
        elif key == "Priority" and current:
            info["paths"][current] = int(value) if value.lstrip("-").isdigit() else value
    return info


def nvcc_release(text) -> dict:
    """`nvcc --version` text -> {release: X.Y, build: X.Y.Z} (None where absent)."""
    match = NVCC_RE.search(str(text or ""))
    return {"release": match.group(1), "build": match.group(2)} if match else {"release": None, "build": None}


def verify_problems(toolkit, nvcc, link_target, package_version, torch=None) -> list:
    """What is wrong after the switch, one sentence each; [] when the toolkit is in place.

    nvcc: registered `nvcc --version` result (rc, stdout, stderr); link_target: where the cuda link
    resolves; package_version: the installed version of the package; torch: registered
    `python -c 'import torch; print(torch.version.cuda)'` result, or None when there is no venv.
    """
    problems = []
    nvcc = nvcc or {}
    if nvcc.get("rc") != 0:
        problems.append("%s/bin/nvcc --version failed (rc %s): %s" % (toolkit["path"], nvcc.get("rc"), _output(nvcc)))
    else:
        found = nvcc_release(nvcc.get("stdout"))
        if found["release"] != toolkit["release"]:
            problems.append("%s/bin/nvcc reports release %s, expected %s" % (toolkit["path"], found["release"],
                                                                             toolkit["release"]))
    if link_target != toolkit["path"]:
        problems.append("the cuda link resolves to %s, expected %s" % (link_target or "nothing", toolkit["path"]))
    if package_version != toolkit["package_version"]:
        problems.append("%s is at %s, expected %s" % (toolkit["package"], package_version or "nothing",
                                                      toolkit["package_version"]))
    if torch is not None:
        if torch.get("rc") != 0:
            problems.append("torch does not import in the venv (rc %s): %s" % (torch.get("rc"), _output(torch)))
        else:
            torch_cuda = str(torch.get("stdout") or "").strip()
            if torch_cuda.split(".", 1)[0] != str(toolkit["major"]):
                problems.append("torch in the venv is built for CUDA %s, the toolkit is CUDA %s: rebuild the venv "
                                "for cu%s (role sglang)" % (torch_cuda or "none", toolkit["release"],
                                                            toolkit["release"].replace(".", "")))
    return problems


def _output(result, limit=400) -> str:
    """The end of what a command printed (its stderr first); Ansible's msg only when it printed nothing."""
    text = " ".join(str(result.get(k) or "").strip() for k in ("stderr", "stdout")).strip()
    return (text or str(result.get("msg") or "").strip() or "no output")[-limit:]


def failure_reason(result) -> str:
    """Why a task failed, for the rollback report: apt's own reason (a full disk, its E: lines) when
    the task ran apt and printed one, ahead of anything else it printed (debconf's "delaying package
    configuration" warning, a bare "non-zero return code"); otherwise Ansible's message."""
    result = result or {}
    msg = str(result.get("msg") or "").strip()
    stderr, stdout = str(result.get("stderr") or ""), str(result.get("stdout") or "")
    reason = apt_reason(msg, stderr, stdout, warnings=False)
    if reason:
        return reason
    if msg and msg != "non-zero return code":
        return msg
    return (stderr.strip() or stdout.strip() or msg or "no output")[-600:]


STATE_KEYS = ("package_version", "selected_path", "selected", "status", "fact", "facts", "systemd_env_existed",
              "recorded")


def rollback_state(content_b64, path="the rollback state file") -> dict:
    """The state an earlier run recorded before its first change (slurp's base64 of the JSON file
    tasks/state.yml writes). A file that is not such a state is an error naming it: silently
    taking the host as it is now would "restore" whatever half-changed state it is in."""
    try:
        state = json.loads(base64.b64decode(str(content_b64 or "")).decode("utf-8"))
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        state, error = None, str(exc)
    else:
        missing = [k for k in STATE_KEYS if k not in state] if isinstance(state, dict) else []
        error = "missing %s" % ", ".join(missing) if isinstance(state, dict) else "not a mapping"
    if not isinstance(state, dict) or any(k not in state for k in STATE_KEYS):
        raise AnsibleFilterError(
            "%s is not a rollback state written by role cuda_toolkit (%s). It would say which toolkit to go back to "
            "after an interrupted run: select the toolkit you want by hand (update-alternatives --set cuda "
            "/usr/local/cuda-X.Y), delete the file, then run again." % (path, error))
    return {k: state[k] for k in STATE_KEYS}


def gpu_jobs(reap_result) -> list:
    """'PID <pid> (<cmdline>)' for every process gpu_reap would stop."""
    jobs = []
    for proc in (reap_result or {}).get("would_kill", []) or []:
        cmdline = proc.get("cmdline") or "[%s]" % proc.get("name", "?")
        jobs.append("PID %s (%s, found by %s)" % (proc.get("pid"), cmdline[:120], proc.get("found_by", "?")))
    return jobs


def _rollback_outcome(toolkit, previous, after, removed=None, reinstalled=None):
    """(selection back as before, package as before, what was done to the package)."""
    def ran(result):
        return bool(result) and not result.get("skipped")

    after = after or {}
    package_ok = True
    if ran(removed) and removed.get("failed"):
        package = "%s could NOT be removed (%s)" % (toolkit["package"], _output(removed, 200))
        package_ok = False
    elif ran(removed) and removed.get("changed"):
        package = "%s removed (it was not installed before)" % toolkit["package"]
    elif ran(reinstalled) and reinstalled.get("failed"):
        package = "%s %s could NOT be reinstalled (%s)" % (toolkit["package"], previous.get("package_version"),
                                                           _output(reinstalled, 200))
        package_ok = False
    elif ran(reinstalled) and reinstalled.get("changed"):
        package = "%s back at %s" % (toolkit["package"], previous.get("package_version"))
    else:
        package = "packages left as they are"
    selection_ok = (after.get("cuda_selected_path") or "") == (previous.get("selected_path") or "")
    return selection_ok, package_ok, package


def rollback_restored(toolkit, previous, after, removed=None, reinstalled=None) -> bool:
    """Whether the rollback put the host back as it was: the selection and the package (the role
    deletes the recorded rollback state only then)."""
    selection_ok, package_ok, _package = _rollback_outcome(toolkit, previous, after, removed, reinstalled)
    return selection_ok and package_ok


def rollback_report(toolkit, previous, failure, after, removed=None, reinstalled=None, host="the host",
                    link="/usr/local/cuda", state_file="", others=None) -> str:
    """The message the play fails with after a rollback: what failed, what was put back, and
    whether the host is as it was (the previous selection back, the package as it was).

    previous: the state recorded in preflight (selected_path, package_version; `recorded` when it
    was read from the rollback state file an interrupted run wrote); after: gpu_facts after the
    rollback; removed / reinstalled: the registered apt results (None or skipped when the step did
    not run); state_file: where that state is kept until the host is back or converged; others: what
    the rollbacks of the stack's other parts did, first ({text, restored}: role sglang's venv).
    """
    after = after or {}
    was = previous.get("selected_path") or ""
    now = after.get("cuda_selected_path") or ""
    selection_ok, package_ok, package = _rollback_outcome(toolkit, previous, after, removed, reinstalled)
    selection = "%s -> %s (nvcc release %s%s)" % (
        link, now or "nothing", after.get("nvcc_release") or "none",
        ", as before" if selection_ok else ", NOT what was selected before: %s" % (was or "nothing"))
    others = [o for o in others or [] if isinstance(o, dict) and o.get("text")]
    others_ok = all(bool(o.get("restored")) for o in others)
    recorded = previous.get("recorded") or ""
    before = (" before the interrupted run of %s" % recorded) if recorded else " before this run"
    if selection_ok and package_ok and others_ok:
        verdict = "The host is as it was%s." % before
    else:
        verdict = "The host is NOT as it was%s: check it by hand%s." % (
            before, ("; the state to restore stays in %s, so the next run puts it back" % state_file)
            if state_file else "")
    steps = [str(o["text"]).strip().rstrip(".") for o in others] + [selection, package]
    return ("CUDA %s on %s failed, so the previous toolkit was put back. Failed: %s. Rollback: %s. %s "
            "Fix the cause and run again." % (toolkit["version"], host, str(failure).strip().rstrip("."),
                                              "; ".join(steps), verdict))


def _stack_row(facts) -> dict:
    facts = facts or {}
    venv = facts.get("venv") or {}
    flashinfer = venv.get("flashinfer") or {}
    installed = {name: v for name, v in flashinfer.items() if v}
    if installed:
        # One public version across the packages; the jit-cache's local label names its CUDA.
        versions = sorted({v.split("+", 1)[0] for v in installed.values()})
        jit = (installed.get("flashinfer-jit-cache") or "").partition("+")[2]
        flash = ", ".join(versions) + (" (jit-cache %s)" % jit if jit else "")
        flash += "" if venv.get("flashinfer_consistent") else " MISMATCH"
    else:
        flash = "-"
    nvcc = facts.get("nvcc_release")
    return {
        "driver": facts.get("driver_version") or "-",
        "toolkits": ", ".join(k.get("version", "?") for k in facts.get("toolkits") or []) or "-",
        "selected": facts.get("cuda_selected") or "-",
        "nvcc": ("%s (V%s)" % (nvcc, facts.get("nvcc_version")) if facts.get("nvcc_version") else nvcc) or "-",
        "torch CUDA": ("%s (torch %s)" % (venv.get("torch_cuda"), venv.get("torch"))
                       if venv.get("torch") else "-"),
        "sglang": venv.get("sglang") or "-",
        "flashinfer": flash,
    }


def stack_table(before, after) -> list:
    """Markdown-style rows: what / before / after, for the CUDA stack of one host."""
    rows_before, rows_after = _stack_row(before), _stack_row(after)
    width = [max(len(k) for k in rows_before) + 1, 8, 8]
    for key in rows_before:
        width[1] = max(width[1], len(rows_before[key]))
        width[2] = max(width[2], len(rows_after[key]))
    line = "| %-*s | %-*s | %-*s |"
    lines = [line % (width[0], "", width[1], "before", width[2], "after"),
             "|-%s-|-%s-|-%s-|" % ("-" * width[0], "-" * width[1], "-" * width[2])]
    for key in rows_before:
        mark = "" if rows_before[key] == rows_after[key] else "*"
        lines.append(line % (width[0], key + mark, width[1], rows_before[key], width[2], rows_after[key]))
    return lines


class FilterModule:
    def filters(self):
        return {
            "cuda_toolkit_target": target,
            "cuda_toolkit_driver_problem": driver_problem,
            "cuda_toolkit_apt_plan": apt_plan,
            "cuda_toolkit_forbidden": forbidden,
            "cuda_toolkit_alternative": alternative,
            "cuda_toolkit_nvcc": nvcc_release,
            "cuda_toolkit_verify_problems": verify_problems,
            "cuda_toolkit_rollback_report": rollback_report,
            "cuda_toolkit_rollback_restored": rollback_restored,
            "cuda_toolkit_rollback_state": rollback_state,
            "cuda_toolkit_gpu_jobs": gpu_jobs,
            "cuda_toolkit_failure_reason": failure_reason,
            "cuda_toolkit_stack_table": stack_table,
        }
