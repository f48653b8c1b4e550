"""Every rendered SGLang flag exists, undeprecated, in that release's own argument definitions.

The wheels of the pinned releases come from PyPI (`pip download --no-deps`, 6-39 MB each) into
.cache/sglang-wheels/ (git-ignored) on first run; sglang is never imported, its
sglang/srt/server_args.py and arg_groups/ are parsed. The same wheels prove that the log
patterns of server_logscan.py are strings SGLang really logs.
"""
import ast
import functools
import glob
import json
import os
import subprocess
import sys
import zipfile

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import resolve_profile
from ansible_collections.servelab.serving.plugins.module_utils.server.argdefs import (
    argdefs_from_sources,
    check_against,
    env_names_from_source,
    sglang_defs_from_wheel,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.logscan import LOG_PATTERNS
from ansible_collections.servelab.serving.plugins.module_utils.server.render import render_server
from ansible_collections.servelab.serving.plugins.module_utils.server.render_sglang import SGLANG_PINNED_VERSIONS

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WHEELS = os.path.join(REPO, ".cache", "sglang-wheels")
with open(os.path.join(REPO, "tests", "data", "sglang", "golden_profiles.json"),
          encoding="utf-8") as _fh:
    PROFILES = json.load(_fh)["sglang"]


def sglang_wheel(version: str) -> str:
    found = glob.glob(os.path.join(WHEELS, f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    os.makedirs(WHEELS, exist_ok=True)
    # Pinned platform and Python so the same wheel is chosen whatever runs the tests.
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
           "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
           "--platform", "manylinux_2_34_x86_64", "-d", WHEELS, f"sglang=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    found = glob.glob(os.path.join(WHEELS, f"sglang-{version}-*.whl"))
    if done.returncode != 0 or not found:
        pytest.fail(f"could not download sglang=={version} from PyPI (needed to check the "
                    f"rendered flags): {done.stderr.strip()[-800:]}")
    return found[0]


@functools.cache
def defs(version):
    return sglang_defs_from_wheel(sglang_wheel(version))


@functools.cache
def log_strings(version):
    """Every string constant in the files that log the features servelab reports on."""
    wanted = ("sglang/srt/server_args.py", "sglang/srt/layers/flashinfer_comm_fusion.py",
              "sglang/srt/distributed/device_communicators/torch_symm_mem.py")
    strings = []
    with zipfile.ZipFile(sglang_wheel(version)) as archive:
        for name in archive.namelist():
            if name in wanted or (name.startswith("sglang/srt/arg_groups/")
                                  and name.endswith(".py")):
                tree = ast.parse(archive.read(name))
                for node in ast.walk(tree):
                    if isinstance(node, ast.Constant) and isinstance(node.value, str):
                        strings.append(node.value)
                    elif isinstance(node, ast.JoinedStr):
                        strings.append("".join(v.value if isinstance(v, ast.Constant) else "{}"
                                               for v in node.values))
    return strings


def rendered(name, version):
    return render_server(resolve_profile(PROFILES[name]), "sglang", "0.0.0.0", None,
                         "/venv/bin/python", engine_version=version)


@pytest.mark.parametrize("version", SGLANG_PINNED_VERSIONS)
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_rendered_flags_exist_in_that_release(version, name):
    flags, env_names = defs(version)
    spec = rendered(name, version)
    problems = check_against(spec.cmd, spec.env, flags, env_names)
    assert problems == [], f"sglang {version}, profile {name}: {problems}"


def test_the_check_catches_flags_of_another_release():
    """The same profile rendered for 0.5.13 is wrong for 0.5.23 and for 0.5.10: the check sees it."""
    spec_old = rendered("switches", "0.5.13.post1")
    problems = check_against(spec_old.cmd, spec_old.env, *defs("0.5.23"))
    kinds = {(p.kind, p.message.split()[0]) for p in problems}
    assert ("deprecated_flag", "--enable-flashinfer-allreduce-fusion") in kinds
    assert ("unknown_flag", "--cuda-graph-max-bs") in kinds
    spec_new = rendered("switches", "0.5.23")
    problems = check_against(spec_new.cmd, spec_new.env, *defs("0.5.10"))
    assert {p.message.split()[0] for p in problems} >= {"--flashinfer-allreduce-fusion-backend",
                                                        "--cuda-graph-max-bs-decode"}


def test_spec_v2_env_var_exists_only_where_it_is_rendered():
    for version in ("0.5.10", "0.5.13.post1"):
        assert "SGLANG_ENABLE_SPEC_V2" in defs(version)[1]
    assert "SGLANG_ENABLE_SPEC_V2" not in defs("0.5.23")[1]
    spec = rendered("eagle3_v2", "0.5.10")
    problems = check_against(spec.cmd, spec.env, *defs("0.5.23"))
    assert [p.message.split()[2] for p in problems if p.kind == "unknown_env"] == [
        "SGLANG_ENABLE_SPEC_V2"]


def test_sglang_log_patterns_are_strings_sglang_logs():
    import re
    versions = SGLANG_PINNED_VERSIONS
    for pattern in LOG_PATTERNS:
        if "sglang" not in pattern.engines:
            continue
        regex = re.compile(pattern.regex)
        assert any(regex.search(s) for v in versions for s in log_strings(v)), (
            f"{pattern.regex!r} matches no string in SGLang {', '.join(versions)}")


# --- the extractor on small sources: both definition styles -------------------------------------

FIELDS_SOURCE = '''
class ExecArgs:
    enable_torch_symm_mem: A[bool, "Enable torch symm mem."] = False
    enable_flashinfer_allreduce_fusion: A[bool, Arg(no_cli=True)] = False
    tp_size: A[int, Arg(help="TP size.", aliases=["--tensor-parallel-size"])] = 1
    renamed: A[int, Arg(help="x", cli_name="--other-name")] = 1
    old_knob: A[int, "Deprecated: use --new-knob."] = 1
    toggle: A[bool, Arg(help="t", action=argparse.BooleanOptionalAction)] = True
    plain: int = 3
'''
PARSER_SOURCE = '''
def add(parser):
    parser.add_argument("--cuda-graph-max-bs", type=int, action=DeprecatedAliasStoreAction,
                        help="Deprecated alias for --cuda-graph-max-bs-decode.")
    parser.add_argument("--port", "-p", type=int, help="The port.")
    parser.add_argument("--enable-flashinfer-allreduce-fusion", action="store_true",
                        help="(Deprecated: use --flashinfer-allreduce-fusion-backend=auto) x")
'''


def test_extractor_reads_fields_and_add_argument_calls():
    found = argdefs_from_sources([("fields.py", FIELDS_SOURCE), ("args.py", PARSER_SOURCE)])
    assert not found["--enable-torch-symm-mem"].deprecated
    assert found["--tensor-parallel-size"].flag == "--tensor-parallel-size"
    assert "--tp-size" in found and "--other-name" in found and "--renamed" not in found
    assert "--toggle" in found and "--no-toggle" in found
    assert "--plain" not in found
    assert found["--old-knob"].deprecated and found["--cuda-graph-max-bs"].deprecated
    assert "--port" in found and "-p" not in found
    # no_cli field, but the deprecated registration exists: present and deprecated.
    assert found["--enable-flashinfer-allreduce-fusion"].deprecated


def test_env_names_come_from_env_assignments():
    text = "class Envs:\n    SGLANG_ENABLE_SPEC_V2 = EnvBool(True)\n    SGLANG_X = EnvInt(1)\n" \
           "    NOT_ENV = 3\n"
    assert env_names_from_source(text) == {"SGLANG_ENABLE_SPEC_V2", "SGLANG_X"}
