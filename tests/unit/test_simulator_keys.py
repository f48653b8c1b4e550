"""A simulator profile's keys are checked against the simulator's own argparse definitions.

What was seen (issue 26): `simulator: {warp_speed: 9}` passed the preflight, started the
server, and the server exited with argparse's usage after the run directory was made."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_preflight import host, run, texts  # noqa: E402

from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import (  # noqa: E402
    ProfileError, resolve_profile,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.render import render_server  # noqa: E402


def render(simulator):
    profile = resolve_profile({"name": "baseline", "simulator": simulator})
    return render_server(profile, "simulator", "127.0.0.1", 30123, sys.executable,
                         simulator_script="/srv/servelab-baseline/servelab_simulator.py")


def test_every_key_the_simulator_defines_renders():
    spec = render({"profile": "eagle3", "time_scale": 20, "seed": 3, "error_rate": 0.1,
                   "fit_report": True, "spec_dynamic": "threshold"})
    assert "--seed" in spec.cmd and "--error-rate" in spec.cmd and "--fit-report" in spec.cmd


def test_the_searched_flags_keys_render():
    keys = {"chunked_prefill_size": 4096, "mixed_chunk": False, "cuda_graph_max_bs": 32,
            "cuda_graph_eager_factor": 1.5, "mem_fraction_static": 0.85,
            "weights_mem_fraction": 0.4, "spec_num_steps": 3, "spec_eagle_topk": 1,
            "spec_num_draft_tokens": 4, "spec_topk_gain": 0.3}
    spec = render(dict(keys, profile="eagle3"))
    for key in keys:
        assert "--" + key.replace("_", "-") in spec.cmd, key
    # a bool field's false is said (the default may be true), a switch's is left out
    cmd = list(spec.cmd)
    assert cmd[cmd.index("--mixed-chunk") + 1] == "false"
    off = list(render({"profile": "eagle3", "speculative": False, "fit_report": False}).cmd)
    assert off[off.index("--speculative") + 1] == "false" and "--fit-report" not in off


@pytest.mark.parametrize("simulator, says", [
    ({"warp_speed": 9}, "simulator.warp_speed: unknown simulator key (the simulator has no "
                        "--warp-speed)"),
    ({"time_scal": 20}, "did you mean time_scale?"),
    ({"port": 1}, "simulator.port is set by servelab (--port"),
])
def test_an_unknown_simulator_key_is_refused_when_rendered(simulator, says):
    with pytest.raises(ProfileError) as err:
        render(simulator)
    assert says in str(err.value), str(err.value)


def test_the_preflight_refuses_it_naming_the_profile():
    report = run(host(bench_profiles=[{"name": "baseline",
                                       "simulator": {"profile": "baseline", "warp_speed": 9}}]))
    assert not report.ok
    [problem] = report.problems
    assert problem.variable == "bench_profiles", texts(report)
    assert problem.message.startswith("bench_profiles[0] (baseline): ")
    assert "simulator.warp_speed: unknown simulator key" in problem.message
