"""A GPU container (gpu_servers) after roles cuda_toolkit and sglang: the selected toolkit, the login
environment and the venv are what the roles' local facts say, and agree with each other.

Local facts (JSON, written by the roles; a host without them skips, naming the missing fact):
  /etc/ansible/facts.d/servelab_cuda.fact    ansible_local.servelab_cuda: version, package,
      package_version, selected, selected_path, installed, nvcc_release, home, env, ...
  /etc/ansible/facts.d/servelab_sglang.fact  ansible_local.servelab_sglang: venv, sglang_version,
      torch, torch_cuda, flashinfer {flashinfer-python, flashinfer-cubin, flashinfer-jit-cache}, ...
Each check is one command on the host (the pct connection runs every command through Ansible).
"""
from __future__ import annotations

import json
import shlex

import pytest

GROUP = "gpu_servers"

# One command: where the link resolves, what its nvcc says, what a login shell gets, what dpkg has.
CUDA_PROBE = r"""
link=$1; root=$2; shift 2
printf 'link=%s\n' "$(readlink -f "$link")"
printf 'nvcc=%s\n' "$("$link/bin/nvcc" --version 2>&1 | grep -o 'release [0-9.]*, V[0-9.]*')"
bash -lc 'printf "login_cuda_home=%s\nlogin_nvcc=%s\nlogin_ld=%s\n" "$CUDA_HOME" "$(command -v nvcc)" "$LD_LIBRARY_PATH"' </dev/null
for pkg in "$@"; do printf 'dpkg %s=%s\n' "$pkg" "$(dpkg-query -W -f='${db:Status-Abbrev}${Version}' "$pkg" 2>/dev/null)"; done
for dir in "$root"/cuda-*.*; do [ ! -L "$dir" ] && [ -x "$dir/bin/nvcc" ] && printf 'toolkit=%s\n' "${dir#"$root"/cuda-}"; done; true
"""

VENV_PROBE = r"""
import json, subprocess, sys
from importlib import metadata
import sglang, torch
names = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")
show = subprocess.run([sys.executable, "-m", "flashinfer", "show-config"], capture_output=True, text=True)
print(json.dumps({"sglang": sglang.__version__, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                  "flashinfer": {n: metadata.version(n) for n in names}, "show_config_rc": show.returncode}))
"""


@pytest.fixture(scope="module")
def facts(host, in_group):
    """ansible_local of the host, as later plays see it (one setup call, local facts only)."""
    result = host.ansible("setup", "gather_subset=!all,!min,local filter=ansible_local", check=False)
    return result.get("ansible_facts", {}).get("ansible_local", {})


@pytest.fixture(scope="module")
def cuda(facts):
    if "servelab_cuda" not in facts:
        pytest.skip("no servelab_cuda local fact (/etc/ansible/facts.d/servelab_cuda.fact): role cuda_toolkit has not run here")
    return facts["servelab_cuda"]


@pytest.fixture(scope="module")
def cuda_state(host, cuda):
    """key -> value lines of CUDA_PROBE (dpkg lines keyed 'dpkg <pkg>', toolkits as a list)."""
    packages = sorted({cuda["package"]} | {"cuda-toolkit-" + v.replace(".", "-") for v in cuda.get("installed", [])})
    root = cuda["selected_path"].rsplit("/", 1)[0]
    result = host.run("sh -c %s probe %s %s %s" % (shlex.quote(CUDA_PROBE), shlex.quote(cuda["home"]),
                                                   shlex.quote(root), " ".join(shlex.quote(p) for p in packages)))
    assert result.rc == 0, result.stderr
    state = {"toolkits": []}
    for line in result.stdout.splitlines():
        key, _sep, value = line.partition("=")
        if key == "toolkit":
            state["toolkits"].append(value)
        else:
            state[key] = value
    return state


@pytest.fixture(scope="module")
def sglang(facts):
    if "servelab_sglang" not in facts:
        pytest.skip("no servelab_sglang local fact (/etc/ansible/facts.d/servelab_sglang.fact): role sglang has not run here")
    return facts["servelab_sglang"]


def test_selected_toolkit_is_the_recorded_one(cuda, cuda_state):
    assert cuda_state["link"] == cuda["selected_path"]
    assert cuda["selected_path"].endswith("/cuda-%s" % cuda["selected"])
    assert cuda_state["nvcc"].startswith("release %s, V" % cuda["selected"]), cuda_state["nvcc"]
    assert cuda["selected"] == ".".join(str(cuda["version"]).split(".")[:2]), \
        "the fact records version %s but %s is selected" % (cuda["version"], cuda["selected"])


def test_pinned_package_and_side_by_side_toolkits(cuda, cuda_state):
    assert cuda_state["dpkg " + cuda["package"]] == "ii " + cuda["package_version"]
    assert sorted(cuda_state["toolkits"]) == sorted(cuda["installed"]), "toolkits with an nvcc on the host"
    for release in cuda["installed"]:
        package = "cuda-toolkit-" + release.replace(".", "-")
        assert cuda_state["dpkg " + package].startswith("ii "), "%s is not installed" % package


def test_login_shells_get_the_selected_toolkit(cuda, cuda_state):
    assert cuda_state["login_cuda_home"] == cuda["home"] == cuda["env"]["CUDA_HOME"]
    assert cuda_state["login_nvcc"] == cuda["home"] + "/bin/nvcc"
    assert cuda["home"] + "/lib64" in cuda_state["login_ld"].split(":")
    assert cuda["env"]["PATH"].split(":")[0] == cuda["home"] + "/bin"


def test_services_get_the_selected_toolkit(host, cuda):
    """The systemd manager's DefaultEnvironment drop-in carries the environment the fact records."""
    if not cuda.get("systemd_env_file"):
        pytest.skip("no systemd_env_file in the servelab_cuda fact (cuda_toolkit_systemd_env_file: '')")
    dropin = host.file(cuda["systemd_env_file"])
    assert dropin.exists, "%s is missing" % cuda["systemd_env_file"]
    text = dropin.content_string
    assert "[Manager]" in text
    for key, value in cuda["env"].items():
        assert '"%s=%s"' % (key, value) in text, "%s=%s is not in %s" % (key, value, cuda["systemd_env_file"])


def test_venv_matches_the_toolkit_and_its_pins(host, cuda, sglang):
    result = host.run("%s -c %s" % (shlex.quote(sglang["venv"] + "/bin/python"), shlex.quote(VENV_PROBE)))
    assert result.rc == 0, "the venv does not import its stack: %s" % result.stderr[-1500:]
    venv = json.loads(result.stdout.strip().splitlines()[-1])
    assert venv["sglang"] == sglang["sglang_version"]
    assert venv["torch"] == sglang["torch"]
    assert str(venv["torch_cuda"]).split(".", 1)[0] == str(cuda["selected"]).split(".", 1)[0], \
        "torch is built for CUDA %s, the selected toolkit is %s" % (venv["torch_cuda"], cuda["selected"])
    assert venv["flashinfer"] == sglang["flashinfer"]
    assert len({v.split("+")[0] for v in venv["flashinfer"].values()}) == 1, venv["flashinfer"]
    assert venv["show_config_rc"] == 0, "flashinfer show-config failed"
