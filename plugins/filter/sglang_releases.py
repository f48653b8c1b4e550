# -*- coding: utf-8 -*-
"""Filters of role sglang over what the released stack says about itself: roles/sglang/vars/releases.yml
(`_sglang_releases`, generated from the wheels by tools/sglang_release_facts.py, every value with the
file and line it was read from).

- sglang_release_problems: the pins against the pinned SGLang release's own metadata (its exact
  torch, sglang-kernel and flashinfer-python requirements, the kernel floor its engine asserts) and
  the kernel release's own torch pin, so that preflight refuses a stack pip cannot install (or
  SGLang will not start with) before anything is touched;
- sglang_fusion_gate (used by sglang_compat): where the pinned SGLang lets FlashInfer's allreduce
  fusion run, what it does on other GPUs (refuse: raises at start; skip: runs unfused), and which
  recorded SGLang/FlashInfer pair, if any, really runs it on a given compute-capability major.

Pure functions (unit-tested in tests/unit/test_sglang_release_filters.py).
"""
from __future__ import annotations

import re

RELEASES_FILE = "roles/sglang/vars/releases.yml"


def _public(version) -> str:
    return str(version or "").split("+", 1)[0].strip()


def _key(version) -> tuple:
    """Sortable PEP 440 key (release, pre-release a < b < rc < final, post)."""
    text = _public(version)
    match = re.match(r"^(\d+(?:\.\d+)*)", text)
    release = tuple(int(p) for p in match.group(1).split(".")) if match else ()
    pre = re.search(r"(a|b|rc)(\d+)", text)
    post = re.search(r"\.post(\d+)", text)
    pre_key = ({"a": 0, "b": 1, "rc": 2}[pre.group(1)], int(pre.group(2))) if pre else (3, 0)
    return release + (0,) * (6 - len(release)), pre_key, int(post.group(1)) if post else -1


def _recorded(releases, kind) -> dict:
    return {str(k): v for k, v in ((releases or {}).get(kind) or {}).items()}


def release_problems(pins, releases) -> dict:
    """{problems: [sentence naming the variable and the fix], notes: [what could not be checked]}.

    pins: the filter sglang_requirements' `versions` (sglang, torch, flashinfer, kernel, kernel_package).
    """
    problems, notes = [], []
    sglang, torch = pins["sglang"], _public(pins["torch"])
    kernel = _public(pins.get("kernel"))
    recorded = _recorded(releases, "sglang")
    facts = recorded.get(sglang)
    if facts is None:
        notes.append("SGLang %s is not among the releases recorded in %s (%s): its own pins were not checked "
                     "before the install (pip checks them while installing)" % (
                         sglang, RELEASES_FILE, ", ".join(sorted(recorded, key=_key)) or "none"))
    else:
        requires, source = facts.get("requires") or {}, facts.get("requires_source")
        kernel_name = "sglang-kernel" if "sglang-kernel" in requires else "sgl-kernel"
        for name, variable, ours in (("torch", "sglang_torch_version", torch),
                                     ("flashinfer-python", "sglang_flashinfer_version", pins["flashinfer"]),
                                     (kernel_name, "sglang_kernel_version", kernel)):
            wanted = requires.get(name)
            if wanted and ours and ours != wanted:
                problems.append("%s is %s, but SGLang %s requires %s==%s (%s): pip cannot install both. Fix: set "
                                "%s: \"%s\" (or an SGLang release that pins %s %s)." % (
                                    variable, ours, sglang, name, wanted, source, variable, wanted, name, ours))
        floor = facts.get("kernel_floor")
        if kernel and floor and _key(kernel) < _key(floor):
            problems.append("sglang_kernel_version is %s, but SGLang %s refuses to start below sglang-kernel %s (%s). "
                            "Fix: set sglang_kernel_version to %s or newer." % (
                                kernel, sglang, floor, facts.get("kernel_floor_source"), floor))
    kernels = _recorded(releases, "sglang_kernel")
    kernel_facts = kernels.get(kernel) if kernel else None
    wanted_torch = ((kernel_facts or {}).get("requires") or {}).get("torch")
    if wanted_torch and wanted_torch != torch:
        fitting = sorted((v for v, f in kernels.items() if (f.get("requires") or {}).get("torch") == torch), key=_key)
        problems.append("sglang_kernel_version %s requires torch==%s (%s), but sglang_torch_version is %s. Fix: set "
                        "sglang_kernel_version to a kernel built for torch %s (recorded: %s)." % (
                            kernel, wanted_torch, kernel_facts.get("requires_source"), torch, torch,
                            ", ".join(fitting) or "none"))
    return {"problems": problems, "notes": notes}


def fusion_gate(sglang_version, releases) -> dict:
    """SGLang's own gate on FlashInfer's allreduce fusion for release `sglang_version`:
    {release, exact, majors, elsewhere, source}. A release not recorded takes the gate of the
    newest recorded one at or below it (else the oldest), and says so (exact: false); no data: {}."""
    recorded = _recorded(releases, "sglang")
    if not recorded:
        return {}
    version = _public(sglang_version)
    older = [v for v in recorded if _key(v) <= _key(version)]
    chosen = version if version in recorded else max(older, key=_key) if older else min(recorded, key=_key)
    facts = recorded[chosen]
    return {"release": chosen, "exact": chosen == version, "majors": [int(m) for m in facts.get("fusion_majors") or []],
            "elsewhere": facts.get("fusion_elsewhere"),
            "source": "%s; majors: %s" % (facts.get("fusion_gate_source"), facts.get("fusion_majors_source"))}


def fusion_pairs(major, releases) -> list:
    """The recorded SGLang releases (with the FlashInfer each pins) that really run the fusion on
    compute-capability `major`: SGLang's gate allows it and its FlashInfer builds it."""
    flashinfer = _recorded(releases, "flashinfer")
    pairs = []
    for version, facts in sorted(_recorded(releases, "sglang").items(), key=lambda kv: _key(kv[0])):
        pinned = (facts.get("requires") or {}).get("flashinfer-python")
        builds = (flashinfer.get(str(pinned)) or {}).get("fusion_majors") or []
        if int(major) in (facts.get("fusion_majors") or []) and int(major) in builds:
            pairs.append("SGLang %s with FlashInfer %s" % (version, pinned))
    return pairs


def gate_problem(label, arch, sglang_version, gate, releases) -> str:
    """The sentence for a GPU whose compute capability SGLang's gate does not allow."""
    major = int(str(arch).split(".", 1)[0])
    what = {"refuse": "refuses FlashInfer's allreduce fusion there (the server fails at start)",
            "skip": "accepts the fusion flag but never runs the fusion there"}
    what = what.get(gate.get("elsewhere"), "does not run the fusion there")
    assumed = "" if gate.get("exact") else " (SGLang %s is not recorded: the gate of %s is assumed)" % (
        sglang_version, gate.get("release"))
    pairs = fusion_pairs(major, releases)
    recorded = sorted(_recorded(releases, "sglang"), key=_key)
    alternative = ("or pin a pair that runs it: %s" % "; ".join(pairs)) if pairs else (
        "no recorded SGLang release (%s) runs it on SM %d.x" % (", ".join(recorded), major))
    return ("%s: SGLang %s %s: it allows the fusion on SM %s only (%s)%s. Fix: set sglang_require_allreduce_fusion: "
            "false, so the servers start without the fusion flag on these GPUs (the bench renders none and its report "
            "says so); %s." % (label, sglang_version, what, "/".join("%d.x" % m for m in gate.get("majors") or []),
                               gate.get("source"), assumed, alternative))


class FilterModule:
    def filters(self):
        return {
            "sglang_release_problems": release_problems,
            "sglang_fusion_gate": fusion_gate,
        }
