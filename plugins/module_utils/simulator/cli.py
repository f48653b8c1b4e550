"""The simulator's command line: `python servelab_simulator.pyz --port N --profile NAME ...`.
Standard library only."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from typing import Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.simulator.predictor import format_fit_report
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    EXIT_DIE_AFTER, PROFILES, SimError, SimProfile, _MODE_ONLY, _positive_float, resolve_profile,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.server import ServerConfig, SimServer

LISTEN_LINE = "servelab-simulator listening on http://{host}:{port}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="servelab_simulator.pyz",
        description="servelab simulator: an OpenAI/SGLang-compatible streaming server on a "
                    "continuous-batching timing model.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000, help="0 = pick a free port")
    ap.add_argument("--profile", default="baseline", help=f"one of {', '.join(PROFILES)}")
    ap.add_argument("--time-scale", default="1.0",
                    help="the model runs this many times faster than real time")
    ap.add_argument("--model-name", default="servelab-sim")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--truth-log", default=None, help="JSON lines, one per finished request")
    ap.add_argument("--die-after", type=int, default=0, metavar="N",
                    help=f"exit (code {EXIT_DIE_AFTER}) right after the N-th request's first "
                         f"chunk")
    ap.add_argument("--error-rate", type=float, default=0.0, metavar="P",
                    help="share of requests that fail: HTTP 500 or an error event mid-stream")
    ap.add_argument("--stall-every", type=int, default=0, metavar="N",
                    help="every N-th request pauses half-way for --stall-ms")
    ap.add_argument("--stall-ms", type=float, default=0.0, metavar="MS",
                    help="stall length, wall-clock ms")
    ap.add_argument("--malformed-every", type=int, default=0, metavar="N",
                    help="every N-th streamed request gets one broken JSON event")
    ap.add_argument("--startup-delay", type=float, default=0.0, metavar="S",
                    help="seconds of 503 (starting) before the server is ready")
    ap.add_argument("--abort-delay-ms", type=float, default=0.0, metavar="MS",
                    help="a disconnected client's request keeps running this many wall-clock "
                         "ms before it is cancelled (0: at once)")
    ap.add_argument("--fit-report", action="store_true",
                    help="print the profiles' fit to the field data and exit")
    group = ap.add_argument_group("profile parameter overrides (model milliseconds)")
    for f in dataclasses.fields(SimProfile):
        if f.name in ("name", "description"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            group.add_argument(flag, dest=f.name, default=None, nargs="?", const="true",
                               metavar="BOOL")
        else:
            group.add_argument(flag, dest=f.name, default=None, metavar=str(f.type).upper())
    return ap


def config_from_args(argv: Optional[Sequence[str]] = None
                     ) -> Tuple[ServerConfig, argparse.Namespace]:
    """Parse and check the command line; raises SimError naming the flag and the fix."""
    args = build_parser().parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(SimProfile)
                 if f.name not in ("name", "description") and getattr(args, f.name) is not None}
    base = resolve_profile(args.profile)[0]
    for name in overrides:
        needs = _MODE_ONLY.get(name)
        mode = overrides.get("mode", base.mode)
        if needs and mode != needs:
            raise SimError(f"--{name.replace('_', '-')} applies to --profile {needs} only "
                           f"(profile {args.profile!r} is {mode})")
    profile, _params = resolve_profile(dict(overrides, profile=args.profile))
    checks = ((args.die_after, "--die-after", 0), (args.stall_every, "--stall-every", 0),
              (args.malformed_every, "--malformed-every", 0), (args.stall_ms, "--stall-ms", 0),
              (args.startup_delay, "--startup-delay", 0), (args.port, "--port", 0),
              (args.abort_delay_ms, "--abort-delay-ms", 0))
    for value, flag, minimum in checks:
        if value < minimum:
            raise SimError(f"{flag} must be >= {minimum} (got {value})")
    if args.port > 65535:
        raise SimError(f"--port must be 0..65535 (got {args.port})")
    if not 0.0 <= args.error_rate <= 1.0:
        raise SimError(f"--error-rate must be a probability within [0, 1] (got {args.error_rate})")
    if args.stall_every and not args.stall_ms:
        raise SimError("--stall-every needs --stall-ms M (how long each stall lasts)")
    cfg = ServerConfig(
        host=args.host, port=args.port, profile=profile,
        time_scale=_positive_float("--time-scale", args.time_scale),
        model_name=args.model_name, seed=args.seed, truth_log=args.truth_log,
        die_after=args.die_after, error_rate=args.error_rate, stall_every=args.stall_every,
        stall_ms=args.stall_ms, malformed_every=args.malformed_every,
        startup_delay=args.startup_delay, abort_delay_ms=args.abort_delay_ms)
    return cfg, args


async def serve(cfg: ServerConfig, on_listening=None) -> None:
    server = SimServer(cfg)
    await server.start()
    # Before the listening line: whoever reads it may send SIGTERM at once.
    server.install_signal_handlers()
    if on_listening is not None:
        on_listening(server)
    await server.serve_until_stopped()


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        cfg, args = config_from_args(argv)
    except SimError as exc:
        sys.stderr.write(f"servelab-simulator: error: {exc}\n")
        return 2
    # A script, not an Ansible module: it writes to its own stdout (stdout.write rather than
    # print, which module_utils may not use) and ends by SystemExit.
    if args.fit_report:
        sys.stdout.write(format_fit_report() + "\n")
        return 0

    def announce(server: SimServer) -> None:
        sys.stdout.write(LISTEN_LINE.format(host=server.host, port=server.port) + "\n")
        sys.stdout.flush()

    try:
        asyncio.run(serve(cfg, announce))
    except OSError as exc:
        sys.stderr.write(f"servelab-simulator: cannot listen on {cfg.host}:{cfg.port}: {exc}\n")
        return 1
    except KeyboardInterrupt:  # pragma: no cover - signal arrived before the handler was set
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
