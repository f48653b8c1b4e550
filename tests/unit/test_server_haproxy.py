"""The router's HAProxy configuration: golden file, the rules, and HAProxy's own check.

`haproxy -c -f` validates the rendered file with the distribution's HAProxy. As root it is
installed when missing (Debian's `haproxy` package; invoke-rc.d is told not to start the
distribution's service); under CI a missing haproxy fails the test, elsewhere it is skipped.
After an intended change: SERVELAB_REGEN_GOLDEN=1 pytest tests/unit/test_server_haproxy.py.
"""
import os
import subprocess

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.server import haproxy

from haproxybin import haproxy_binary

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "data", "haproxy", "router.cfg")
SPLIT = haproxy.RouterSplit(listen_host="127.0.0.1", listen_port=30123, spec_port=30124,
                            base_port=30125, spec_max_conn=3, spec_gpus="0,1,2,3",
                            base_gpus="4,5,6,7")


def test_router_config_matches_the_golden_file():
    text = haproxy.render_config(SPLIT)
    if os.environ.get("SERVELAB_REGEN_GOLDEN"):
        with open(GOLDEN, "w", encoding="utf-8") as fh:
            fh.write(text)
    with open(GOLDEN, encoding="utf-8") as fh:
        assert text == fh.read(), f"{GOLDEN} differs (regenerate and review if intended)"


def test_router_config_routes_by_the_speculative_servers_requests_in_flight():
    text = haproxy.render_config(SPLIT)
    assert "use_backend spec if { be_conn(spec) lt 3 }" in text
    assert "default_backend base" in text
    assert "server spec 127.0.0.1:30124 maxconn 3" in text     # the hard cap behind the rule
    assert "nbthread 1" in text                                # check-then-count on one thread
    assert "GPU split: 4 GPUs speculative (0,1,2,3), 4 GPUs baseline (4,5,6,7)." in text


@pytest.mark.haproxy
def test_haproxy_accepts_the_rendered_config(tmp_path):
    binary = haproxy_binary()
    path = tmp_path / "router.cfg"
    path.write_text(haproxy.render_config(SPLIT))
    out = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    # A broken rule is caught by the same check (the check can fail).
    path.write_text(haproxy.render_config(SPLIT).replace("be_conn(spec)", "be_conn(nosuch)"))
    bad = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode != 0


@pytest.mark.parametrize("change, message", [
    ({"spec_port": 30123}, "three different ports"),
    ({"spec_max_conn": 0}, "spec_max_conn"),
    ({"maxconn": 3}, "maxconn must be an integer above"),
    ({"listen_port": 70000}, "listen_port"),
])
def test_bad_router_settings_are_named(change, message):
    import dataclasses
    with pytest.raises(haproxy.RouterError, match=message):
        haproxy.render_config(dataclasses.replace(SPLIT, **change))


def test_the_gpu_split_is_stated_without_ids_too():
    bare = haproxy.RouterSplit("127.0.0.1", 1, 2, 3, 2)
    assert haproxy.gpu_split_statement(bare, 8) == "4 GPUs speculative, 4 GPUs baseline"
