"""SGLang's own allreduce-fusion gate in the renderer (module_utils/server/fusion_gate.py): its data
agrees with what the wheels say (roles/sglang/vars/releases.yml), and a fusion flag the installed
SGLang refuses on the server's GPUs is never rendered."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ansible_collections.servelab.serving.plugins.module_utils.server import fusion_gate
from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import resolve_profile
from ansible_collections.servelab.serving.plugins.module_utils.server.render import render_server
from ansible_collections.servelab.serving.plugins.module_utils.server.versions import parse_version

RELEASES = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles" / "sglang" / "vars" / "releases.yml")
                          .read_text())["_sglang_releases"]["sglang"]
PROFILE = {"name": "fused", "model": "/models/m", "tp": 8, "flashinfer_allreduce_fusion": True}


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_gate_table_is_what_each_recorded_release_says(release):
    majors, elsewhere, source = fusion_gate.gate(parse_version(release))
    facts = RELEASES[release]
    assert (list(majors), elsewhere) == (facts["fusion_majors"], facts["fusion_elsewhere"])
    assert facts["fusion_gate_source"].startswith(source.split()[0])


def render(version, archs):
    return render_server(resolve_profile(PROFILE), "sglang", "0.0.0.0", None, "/venv/bin/python",
                         engine_version=version, gpu_archs=archs)


def test_sm120_with_sglang_0_5_23_gets_no_fusion_flag_and_a_note():
    spec = render("0.5.23", ["12.0"])
    assert not any("allreduce-fusion" in part for part in spec.cmd), spec.cmd
    assert spec.notes[0].startswith("flashinfer_allreduce_fusion: not rendered: SGLang 0.5.23 refuses it (the server "
                                    "would fail at start) on SM 12.0, allowing it on SM 9.x/10.x only"), spec.notes


def test_older_sglang_on_sm120_is_not_given_a_flag_it_ignores():
    spec = render("0.5.13.post1", ["12.0", "12.0"])
    assert "--enable-flashinfer-allreduce-fusion" not in spec.cmd
    assert "accepts the flag but never runs it on SM 12.0" in spec.notes[0]


@pytest.mark.parametrize("archs, flag", [(["9.0"], "--flashinfer-allreduce-fusion-backend"),
                                         (["10.0", "10.3"], "--flashinfer-allreduce-fusion-backend"),
                                         (None, "--flashinfer-allreduce-fusion-backend")])
def test_allowed_or_unknown_gpus_keep_the_flag(archs, flag):
    spec = render("0.5.23", archs)
    assert spec.cmd[spec.cmd.index(flag) + 1] == "auto" and not spec.notes


def test_one_refused_gpu_among_allowed_ones_drops_the_flag():
    spec = render("0.5.23", ["9.0", "12.0"])
    assert "--flashinfer-allreduce-fusion-backend" not in spec.cmd and "on SM 12.0," in spec.notes[0]


def test_the_flag_left_out_is_reported_as_a_skipped_feature(tmp_path):
    from ansible_collections.servelab.serving.plugins.module_utils.server import manager
    spec = render("0.5.23", ["12.0"])
    result = manager.ServerResult(changed=False, action="unchanged", name="s", state="started",
                                  notes=list(spec.notes), log_path=str(tmp_path / "absent.log"))
    manager._scan(result, "sglang")
    assert result.features_skipped == [spec.notes[0]]
