"""The columns that make a level row self-describing (the run, engine, model, time scale and the
host's GPUs), read from the manifest: `describe`.

A leaf of the report package (it imports nothing of it but analysis.finite_number): export.py and
peer_export.py both need it, and it lived in export.py, which imports peer_export.py: its home
here, imported by both, ends that cycle.
"""
from __future__ import annotations

from collections import Counter

from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import (
    finite_number as _number,
)


def _text(value):
    return None if value in (None, "") else str(value)


def describe(manifest: dict, run_id: str) -> dict:
    """(host, profile) -> the describing columns, from the manifest ('*' host: every host)."""
    hosts = manifest.get("hosts") if isinstance(manifest.get("hosts"), dict) else {}
    gpus: dict = {}
    settings: dict = {}
    for host, info in hosts.items():
        info = info if isinstance(info, dict) else {}
        facts = info.get("gpu_facts") if isinstance(info.get("gpu_facts"), dict) else {}
        found = [g for g in facts.get("gpus") or [] if isinstance(g, dict)]
        names = Counter(str(g.get("name") or "GPU") for g in found)
        gpus[str(host)] = (names.most_common(1)[0][0] if names else None,
                           len(found) if isinstance(facts.get("gpus"), list) else None)
        settings[str(host)] = info.get("bench") if isinstance(info.get("bench"), dict) else {}
    out: dict = {}
    profiles = manifest.get("profiles") if isinstance(manifest.get("profiles"), dict) else {}
    for profile, by_host in profiles.items():
        if not isinstance(by_host, dict):
            continue
        for host, raw in by_host.items():
            if not isinstance(raw, dict):
                continue
            simulator = raw.get("simulator") if isinstance(raw.get("simulator"), dict) else {}
            bench = settings.get(str(host), {})
            out[(str(host), str(profile))] = {
                "run_id": run_id,
                "engine": _text(raw.get("engine") or bench.get("engine")),
                "engine_version": _text(raw.get("engine_version") or raw.get("version")),
                "model": _text(raw.get("model") or bench.get("model")),
                "time_scale": _number(raw.get("time_scale", simulator.get("time_scale"))),
                "gpu_name": gpus.get(str(host), (None, None))[0],
                "gpu_count": gpus.get(str(host), (None, None))[1],
            }
    return out
