"""What manifest.json says about the run, as the report states it: simulator time scale, engines,
server command lines, skipped features, failed profiles, GPUs.

The manifest is written by many tasks (bench_manifest); its per-profile records live under
`profiles.<profile>.<host>` (docs/results.md, the results contract). A flat `profiles.<profile>` record (no host
level) is accepted too and applies to every host. Nothing here fails on an odd manifest: missing
or malformed parts are simply not reported.

Command lines, env, errors and log tails are redacted here once more (module_utils/redact.py):
bench_manifest writes them redacted, but the report is the file people mail, and a manifest may
come from an older servelab or be written by hand.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from ansible_collections.servelab.serving.plugins.plugin_utils.report.interruption import (
    ENDED, Interruption, interruption,
)
from ansible_collections.servelab.serving.plugins.module_utils.redact import (
    collect_secrets,
    redact_cmdline,
    redact_env,
    redact_text,
)

# Keys that mark a flat per-profile record (no host level in between).
_RECORD_KEYS = {"status", "time_scale", "cmdline", "engine", "env", "error", "features_skipped"}


@dataclass
class ProfileRecord:
    profile: str
    host: str
    engine: str | None = None
    time_scale: float | None = None
    status: str | None = None
    cmdline: str | None = None
    env: dict = field(default_factory=dict)
    features_skipped: list = field(default_factory=list)
    error: str | None = None
    failed_task: str | None = None
    log_tail: str | None = None


@dataclass
class RunContext:
    run_id: str
    started_at: str | None
    finished_at: str | None
    git_commit: str | None
    git_dirty: bool | None
    records: list  # ProfileRecord per (profile, host) the manifest knows
    gpus: dict  # host -> "8x NVIDIA RTX PRO 6000 ..., driver 580.x"
    time_scale_text: str
    # how a run that did not finish ended (report/interruption.py); None when it finished
    interruption: Interruption | None = None


def _scale(value) -> float | None:
    if value in (None, "", "None", "null"):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _text(value) -> str | None:
    if value in (None, ""):
        return None
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def _cmdline(value, secrets) -> str | None:
    if isinstance(value, (list, tuple)):
        value = shlex.join(str(v) for v in value)
    return redact_cmdline(_text(value), secrets)


def _record(profile: str, host: str, raw: dict, secrets=frozenset()) -> ProfileRecord:
    """secrets: values seen as secrets anywhere in the manifest, masked in every text here."""
    simulator = raw.get("simulator") if isinstance(raw.get("simulator"), dict) else {}
    skipped = raw.get("features_skipped")
    env = raw.get("env")
    return ProfileRecord(
        profile=profile,
        host=host,
        engine=_text(raw.get("engine")),
        time_scale=_scale(raw.get("time_scale", simulator.get("time_scale"))),
        status=_text(raw.get("status")),
        cmdline=_cmdline(raw.get("cmdline") or raw.get("cmd"), secrets),
        env=redact_env(env) if isinstance(env, dict) else {},
        features_skipped=([redact_text(str(s), secrets) for s in skipped]
                          if isinstance(skipped, list) else []),
        error=redact_text(_text(raw.get("error")), secrets),
        failed_task=_text(raw.get("failed_task")),
        log_tail=redact_text(_text(raw.get("log_tail")), secrets),
    )


def profile_records(manifest: dict) -> list:
    records = []
    profiles = manifest.get("profiles")
    if not isinstance(profiles, dict):
        return records
    secrets = collect_secrets(manifest)
    for profile, by_host in profiles.items():
        if not isinstance(by_host, dict):
            continue
        if _RECORD_KEYS & set(by_host):
            records.append(_record(str(profile), "*", by_host, secrets))
            continue
        for host, raw in by_host.items():
            if isinstance(raw, dict):
                records.append(_record(str(profile), str(host), raw, secrets))
    return records


def _gpu_summary(facts: dict) -> str | None:
    gpus = facts.get("gpus") if isinstance(facts, dict) else None
    if not isinstance(gpus, list):
        return None
    if not gpus:
        return f"no GPU ({facts.get('reason') or 'none found'})"
    names: dict = {}
    for gpu in gpus:
        name = gpu.get("name", "GPU") if isinstance(gpu, dict) else "GPU"
        names[name] = names.get(name, 0) + 1
    text = ", ".join(f"{n}x {name}" for name, n in names.items())
    if facts.get("driver_version"):
        text += f"; driver {facts['driver_version']}"
    if facts.get("cuda_selected") or facts.get("nvcc_release"):
        text += f"; CUDA {facts.get('cuda_selected') or facts.get('nvcc_release')}"
    return text


def time_scale_statement(records: list, measured: set) -> str:
    """One sentence on the simulator's time scale; the report always states the factor."""
    relevant = [
        r
        for r in records
        if (r.profile, r.host) in measured
        or (r.host == "*" and any(p == r.profile for p, _host in measured))
    ]
    scaled = sorted({(r.profile, r.time_scale) for r in relevant if r.time_scale is not None})
    simulated = sorted({r.profile for r in relevant if (r.engine or "") == "simulator"})
    if scaled:
        factors = sorted({s for _key, s in scaled})
        if len(factors) == 1:
            which = f"time_scale {factors[0]:g} for {', '.join(sorted({p for p, _factor in scaled}))}"
        else:
            which = "time_scale " + ", ".join(f"{p}={s:g}" for p, s in scaled)
        return (
            f"Simulator {which} (from manifest.json): the simulated engine ran its calibrated "
            "model at that speed factor relative to real time. The figures here are as measured "
            "and are not rescaled; the shape of the curves and the crossover concurrency do "
            "not depend on the factor, absolute tok/s and latencies do."
        )
    if simulated:
        return (
            f"Profiles {', '.join(simulated)} ran on the simulator, and manifest.json records "
            "no time_scale for them (the simulator's default applied). Figures are as measured."
        )
    if not records:
        return (
            "manifest.json records no engine or time_scale for these profiles, so it is not "
            "known whether they ran on the simulator or in real time."
        )
    return "No profile ran on a time-scaled simulator: figures are real-time measurements."


def run_context(manifest: dict, run_id: str, measured: set) -> RunContext:
    records = profile_records(manifest)
    intr = interruption(manifest, run_id)
    if intr is not None:
        # a profile still `started` in a closed run is the one the interruption cut short
        records = [dataclasses.replace(r, status=intr.status)
                   if (r.status or "").lower() == "started" else r for r in records]
    git = manifest.get("git") if isinstance(manifest.get("git"), dict) else {}
    commit = _text(git.get("commit") or manifest.get("git_commit"))
    gpus = {}
    hosts = manifest.get("hosts") if isinstance(manifest.get("hosts"), dict) else {}
    for host, info in hosts.items():
        summary = _gpu_summary(info.get("gpu_facts")) if isinstance(info, dict) else None
        if summary:
            gpus[str(host)] = summary
    return RunContext(
        run_id=run_id,
        started_at=_text(manifest.get("started_at")),
        finished_at=_text(manifest.get("finished_at") or manifest.get("ended_at")),
        git_commit=commit,
        git_dirty=git.get("dirty") if isinstance(git.get("dirty"), bool) else None,
        records=records,
        gpus=gpus,
        time_scale_text=time_scale_statement(records, measured),
        interruption=intr,
    )


def failed_records(context: RunContext) -> list:
    """Profiles that failed, or started and never finished (a run cut short)."""
    return [r for r in context.records
            if (r.status or "").lower() in ("failed", "started") + ENDED]
