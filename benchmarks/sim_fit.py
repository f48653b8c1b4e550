"""Fit the simulator's field profiles to the field data (docs/architecture.md, 'The simulator'). Standard library.

    python3 benchmarks/sim_fit.py [--margin 0.03] [--moe-token-share 0.2]
        [--prefill-per-token-ms 0.05] [--iterations 120]

Least squares (Nelder-Mead) over the relative residuals of simulator.fit_residuals(), i.e. of
predict_level(), the deterministic discrete-event model of the server's scheduler, at the
default workload (DEFAULT_PROMPT_TOKENS in, DEFAULT_OUTPUT_TOKENS out). Free parameters: moe_ms,
request_overhead_ms, baseline and eagle3 step_per_req_ms; step_base_ms follows from the
single-stream figures. A penalty holds the field's ordering: speculation ahead at C=1 and C=2,
behind from C=5, by at least --margin. Prints the _FIT dict to paste into simulator/profiles.py and the
report of the result. Takes about five minutes.
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402
collection_link.importable()
from ansible_collections.servelab.serving.plugins.module_utils.simulator.predictor import (  # noqa: E402
    fit_residuals, format_fit_report, predict_level,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (  # noqa: E402
    _FIT, fitted_profiles, SimError, validate_profile,
)

FREE = ("moe_ms", "request_overhead_ms", "baseline_per_req_ms", "eagle3_per_req_ms")


def objective(fit, margin):
    try:
        profiles = fitted_profiles(fit)
        for p in profiles.values():
            validate_profile(p)
            if p.step_base_ms <= 0.5:
                return 1e9
    except SimError:
        return 1e9
    if min(fit[k] for k in FREE) < 0:
        return 1e9
    err = sum(r.residual ** 2 for r in fit_residuals(profiles))
    b, s = profiles["baseline"], profiles["eagle3"]
    for c, spec_ahead in ((1, True), (2, True), (5, False)):
        ratio = (predict_level(s, c).output_tok_s / predict_level(b, c).output_tok_s)
        short = (1 + margin - ratio) if spec_ahead else (ratio - (1 - margin))
        err += 50 * max(0.0, short) ** 2
    return err


def nelder_mead(fun, x0, steps, iterations):
    n = len(x0)
    pts = [list(x0)] + [[x0[j] + (steps[j] if j == i else 0.0) for j in range(n)]
                        for i in range(n)]
    vals = [fun(p) for p in pts]
    for _i in range(iterations):
        order = sorted(range(n + 1), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        c = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        xr = [2 * c[j] - pts[-1][j] for j in range(n)]
        fr = fun(xr)
        if fr < vals[0]:
            xe = [3 * c[j] - 2 * pts[-1][j] for j in range(n)]
            fe = fun(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = [(c[j] + pts[-1][j]) / 2 for j in range(n)]
            fc = fun(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = [(pts[0][j] + pts[i][j]) / 2 for j in range(n)]
                    vals[i] = fun(pts[i])
    best = min(range(n + 1), key=vals.__getitem__)
    return pts[best], vals[best]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--margin", type=float, default=0.03,
                    help="required lead of speculation at C=1-2 and of baseline at C=5")
    ap.add_argument("--moe-token-share", type=float, default=_FIT["moe_token_share"])
    ap.add_argument("--prefill-per-token-ms", type=float,
                    default=_FIT["prefill_per_token_ms"])
    ap.add_argument("--iterations", type=int, default=300)
    args = ap.parse_args(argv)
    fixed = dict(_FIT, moe_token_share=args.moe_token_share,
                 prefill_per_token_ms=args.prefill_per_token_ms)

    def fun(x):
        return objective(dict(fixed, **dict(zip(FREE, x))), args.margin)

    x0 = [_FIT[k] for k in FREE]
    x, value = nelder_mead(fun, x0, [5.0, 150.0, 0.2, 1.0], args.iterations)
    x, value = nelder_mead(fun, x, [1.0, 30.0, 0.05, 0.2], args.iterations)
    fit = dict(fixed, **{k: round(v, 3) for k, v in zip(FREE, x)})
    print(f"objective {value:.5f} (sum of squared relative residuals + ordering penalty)")
    print("_FIT = {")
    for k, v in fit.items():
        print(f"    {k!r}: {v!r},")
    print("}")
    print(format_fit_report(fitted_profiles(fit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
