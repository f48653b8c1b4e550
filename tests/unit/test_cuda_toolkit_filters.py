"""Unit tests of role cuda_toolkit's filters: the target from a version, the driver floor, apt's plan,
update-alternatives' answer, the verify checks and the before/after table. The lab tests
(tests/lab/test_cuda_upgrade.py) run the role itself."""
from __future__ import annotations


import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.servelab.serving.plugins.filter import cuda_toolkit as filters

FLOORS = {"12": "525", "13": "580"}
T13 = filters.target("13.0.1")

NVCC_13 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""


def test_target_pins_the_package_to_the_full_version():
    assert T13 == {"version": "13.0.1", "release": "13.0", "major": "13", "package": "cuda-toolkit-13-0",
                   "package_version": "13.0.1-1", "spec": "cuda-toolkit-13-0=13.0.1-1", "path": "/usr/local/cuda-13.0"}
    assert filters.target("12.8.1", "2", "/opt/")["spec"] == "cuda-toolkit-12-8=12.8.1-2"
    assert filters.target("12.8.1", "2", "/opt/")["path"] == "/opt/cuda-12.8"


@pytest.mark.parametrize("version", ["13.0", "13", "13.0.1-1", "v13.0.1", "", "13.0.x"])
def test_target_refuses_anything_but_x_y_z(version):
    with pytest.raises(AnsibleFilterError, match=r"cuda_toolkit_version: .* is not a full toolkit version X\.Y\.Z"):
        filters.target(version)


def test_target_refuses_a_bad_revision():
    with pytest.raises(AnsibleFilterError, match="cuda_toolkit_package_revision"):
        filters.target("13.0.1", "1 && rm")


@pytest.mark.parametrize("driver, ok", [("580.65.06", True), ("580.95.05", True), ("590.1", True),
                                        ("575.57.08", False), ("570.172.08", False), ("58.0", False)])
def test_driver_floor_of_cuda_13(driver, ok):
    problem = filters.driver_problem({"driver_version": driver}, T13, FLOORS, "ct129")
    assert (problem == "") is ok
    if not ok:
        assert "NVIDIA driver %s on ct129 is too old for CUDA 13.0.1" % driver in problem
        assert "needs driver >= 580" in problem and "Nothing was changed" in problem


def test_driver_floor_follows_the_major():
    assert filters.driver_problem({"driver_version": "570.172.08"}, filters.target("12.8.1"), FLOORS) == ""


def test_no_driver_says_why_and_how_to_skip():
    problem = filters.driver_problem({"driver_version": None, "reason": "nvidia-smi: not found"}, T13, FLOORS, "ct129")
    assert "ct129 sees no driver (nvidia-smi: not found)" in problem and "cuda_toolkit_check_driver: false" in problem


def test_missing_floor_names_the_variable():
    problem = filters.driver_problem({"driver_version": "580.1"}, filters.target("14.0.0"), FLOORS)
    assert "cuda_toolkit_driver_floor has no entry for CUDA 14" in problem


APT_SIMULATION = """NOTE: This is only a simulation!
Reading package lists...
The following NEW packages will be installed:
  cuda-drivers-580 cuda-toolkit-13-0 nvidia-driver-580
Inst nvidia-driver-580 (580.95.05-1 cuda [amd64])
Inst cuda-drivers-580 (580.95.05-1 cuda [amd64])
Inst cuda-toolkit-13-0 (13.0.1-1 cuda [amd64])
Conf cuda-toolkit-13-0 (13.0.1-1 cuda [amd64])
"""


def test_apt_plan_and_forbidden_driver_packages():
    plan = filters.apt_plan(APT_SIMULATION)
    assert plan == ["nvidia-driver-580", "cuda-drivers-580", "cuda-toolkit-13-0"]
    patterns = ["^cuda$", r"^cuda-\d+-\d+$", "^cuda-drivers", "^nvidia-driver", "^libnvidia-"]
    assert filters.forbidden(plan, patterns) == ["nvidia-driver-580", "cuda-drivers-580"]
    assert filters.forbidden(["cuda-toolkit-13-0", "cuda-13-0", "cuda"], patterns) == ["cuda-13-0", "cuda"]


def test_forbidden_reports_a_bad_regex():
    with pytest.raises(AnsibleFilterError, match="cuda_toolkit_forbidden_packages"):
        filters.forbidden(["x"], ["("])


def test_alternative_query():
    text = ("Name: cuda\nLink: /usr/local/cuda\nStatus: auto\nBest: /usr/local/cuda-13.0\nValue: /usr/local/cuda-13.0\n\n"
            "Alternative: /usr/local/cuda-12.8\nPriority: 128\n\nAlternative: /usr/local/cuda-13.0\nPriority: 130\n")
    assert filters.alternative(text) == {"status": "auto", "value": "/usr/local/cuda-13.0",
                                         "paths": {"/usr/local/cuda-12.8": 128, "/usr/local/cuda-13.0": 130}}
    assert filters.alternative("") == {"status": None, "value": None, "paths": {}}
    assert filters.alternative("Status: manual\nValue: none\n")["value"] is None


def test_verify_passes_when_everything_agrees():
    ok = {"rc": 0, "stdout": NVCC_13}
    assert filters.verify_problems(T13, ok, "/usr/local/cuda-13.0", "13.0.1-1", {"rc": 0, "stdout": "13.0\n"}) == []
    assert filters.verify_problems(T13, ok, "/usr/local/cuda-13.0", "13.0.1-1", None) == []


def test_verify_names_each_problem():
    broken = {"rc": 127, "stdout": "", "stderr": "nvcc: error while loading shared libraries: libnvptxcompiler.so.13"}
    problems = filters.verify_problems(T13, broken, "/usr/local/cuda-12.8", "13.0.0-1",
                                       {"rc": 0, "stdout": "12.8\n"})
    assert problems[0].startswith("/usr/local/cuda-13.0/bin/nvcc --version failed (rc 127): nvcc: error while loading")
    assert problems[1] == "the cuda link resolves to /usr/local/cuda-12.8, expected /usr/local/cuda-13.0"
    assert problems[2] == "cuda-toolkit-13-0 is at 13.0.0-1, expected 13.0.1-1"
    assert problems[3].startswith("torch in the venv is built for CUDA 12.8, the toolkit is CUDA 13.0")
    wrong_release = filters.verify_problems(T13, {"rc": 0, "stdout": NVCC_13.replace("13.0", "12.8")},
                                            "/usr/local/cuda-13.0", "13.0.1-1")
    assert wrong_release == ["/usr/local/cuda-13.0/bin/nvcc reports release 12.8, expected 13.0"]
    no_torch = filters.verify_problems(T13, {"rc": 0, "stdout": NVCC_13}, "/usr/local/cuda-13.0", "13.0.1-1",
                                       {"rc": 1, "stderr": "ModuleNotFoundError: No module named 'torch'"})
    assert no_torch == ["torch does not import in the venv (rc 1): ModuleNotFoundError: No module named 'torch'"]
    # A missing nvcc: the command module prints nothing and says why in msg.
    missing = filters.verify_problems(T13, {"rc": 2, "stdout": "", "stderr": "",
                                            "msg": "[Errno 2] No such file or directory: b'/usr/local/cuda-13.0/bin/nvcc'"},
                                      "/usr/local/cuda-13.0", "13.0.1-1")
    assert missing == ["/usr/local/cuda-13.0/bin/nvcc --version failed (rc 2): [Errno 2] No such file or directory: "
                       "b'/usr/local/cuda-13.0/bin/nvcc'"]


def test_gpu_jobs_lists_pids_and_command_lines():
    result = {"would_kill": [{"pid": 4242, "cmdline": "sglang::scheduler_TP0", "found_by": "pattern"},
                             {"pid": 4243, "cmdline": "", "name": "python3", "found_by": "descendant"}]}
    assert filters.gpu_jobs(result) == ["PID 4242 (sglang::scheduler_TP0, found by pattern)",
                                        "PID 4243 ([python3], found by descendant)"]
    assert filters.gpu_jobs({"skipped": True}) == []


def _facts(selected, kits, torch_cuda=None, jit=None):
    venv = None
    if torch_cuda:
        venv = {"torch": "2.9.1+cu%s" % torch_cuda.replace(".", ""), "torch_cuda": torch_cuda, "sglang": "0.5.10",
                "flashinfer": {"flashinfer-python": "0.6.7.post2", "flashinfer-cubin": "0.6.7.post2",
                               "flashinfer-jit-cache": jit},
                "flashinfer_consistent": True}
    return {"driver_version": "580.95.05", "toolkits": [{"version": k} for k in kits], "cuda_selected": selected,
            "nvcc_release": selected, "nvcc_version": {"12.8": "12.8.93", "13.0": "13.0.88"}.get(selected), "venv": venv}


def test_stack_table_marks_what_changed():
    before = _facts("12.8", ["12.8"], "12.8", "0.6.7.post2+cu128")
    after = _facts("13.0", ["12.8", "13.0"], "13.0", "0.6.7.post2+cu130")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
            for line in filters.stack_table(before, after)[2:]}
    assert rows["driver"] == ["580.95.05", "580.95.05"]
    assert rows["toolkits*"] == ["12.8", "12.8, 13.0"]
    assert rows["selected*"] == ["12.8", "13.0"]
    assert rows["nvcc*"] == ["12.8 (V12.8.93)", "13.0 (V13.0.88)"]
    assert rows["torch CUDA*"] == ["12.8 (torch 2.9.1+cu128)", "13.0 (torch 2.9.1+cu130)"]
    assert rows["sglang"] == ["0.5.10", "0.5.10"]
    assert rows["flashinfer*"] == ["0.6.7.post2 (jit-cache cu128)", "0.6.7.post2 (jit-cache cu130)"]


def test_stack_table_of_a_bare_host_and_a_mismatch():
    bare = {"driver_version": None, "toolkits": [], "cuda_selected": None, "venv": None}
    mixed = _facts("13.0", ["13.0"], "13.0", "0.6.8+cu130")
    mixed["venv"]["flashinfer_consistent"] = False
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
            for line in filters.stack_table(bare, mixed)[2:]}
    assert rows["selected*"] == ["-", "13.0"]
    assert rows["flashinfer*"] == ["-", "0.6.7.post2, 0.6.8 (jit-cache cu130) MISMATCH"]


PREVIOUS = {"selected_path": "/usr/local/cuda-12.8", "package_version": ""}
FAILURE = "servelab: check CUDA 13.0.1: /usr/local/cuda-13.0/bin/nvcc --version failed (rc 127): libnvptxcompiler.so.13"


def test_rollback_report_of_a_clean_rollback():
    after = {"cuda_selected_path": "/usr/local/cuda-12.8", "nvcc_release": "12.8"}
    report = filters.rollback_report(T13, PREVIOUS, FAILURE, after, {"changed": True}, {"skipped": True}, "ct129")
    assert report == (
        "CUDA 13.0.1 on ct129 failed, so the previous toolkit was put back. Failed: " + FAILURE + ". "
        "Rollback: /usr/local/cuda -> /usr/local/cuda-12.8 (nvcc release 12.8, as before); cuda-toolkit-13-0 removed "
        "(it was not installed before). The host is as it was before this run. Fix the cause and run again.")


def test_rollback_report_of_a_reinstalled_previous_version():
    previous = {"selected_path": "/usr/local/cuda-13.0", "package_version": "13.0.0-1"}
    after = {"cuda_selected_path": "/usr/local/cuda-13.0", "nvcc_release": "13.0"}
    report = filters.rollback_report(T13, previous, FAILURE, after, {"skipped": True}, {"changed": True}, "ct129")
    assert "cuda-toolkit-13-0 back at 13.0.0-1" in report and "The host is as it was before this run." in report


def test_rollback_report_says_when_the_host_is_not_as_it_was():
    after = {"cuda_selected_path": "/usr/local/cuda-13.0", "nvcc_release": None}
    report = filters.rollback_report(T13, PREVIOUS, FAILURE, after,
                                     {"failed": True, "msg": "dpkg was interrupted", "stderr": ""}, None, "ct129")
    assert "/usr/local/cuda -> /usr/local/cuda-13.0 (nvcc release none, NOT what was selected before: " \
           "/usr/local/cuda-12.8)" in report
    assert "cuda-toolkit-13-0 could NOT be removed (dpkg was interrupted)" in report
    assert report.endswith("The host is NOT as it was before this run: check it by hand. Fix the cause and run again.")
    assert not filters.rollback_restored(T13, PREVIOUS, after, {"failed": True, "msg": "x"}, None)
    # The selection is back but the package could not be put back: still not "as it was".
    back = {"cuda_selected_path": "/usr/local/cuda-12.8", "nvcc_release": "12.8"}
    report = filters.rollback_report(T13, dict(PREVIOUS, package_version="13.0.0-1"), FAILURE, back, None,
                                     {"failed": True, "msg": "Version '13.0.0-1' for 'cuda-toolkit-13-0' was not found"})
    assert "could NOT be reinstalled" in report and "check it by hand" in report


def test_rollback_report_of_a_state_recorded_by_an_interrupted_run():
    after = {"cuda_selected_path": "/usr/local/cuda-12.8", "nvcc_release": "12.8"}
    previous = dict(PREVIOUS, recorded="2026-12-03T14:30:00Z")
    report = filters.rollback_report(T13, previous, FAILURE, after, {"changed": True}, None, "ct129",
                                     state_file="/var/lib/servelab/cuda_toolkit-rollback.json")
    assert "The host is as it was before the interrupted run of 2026-12-03T14:30:00Z." in report
    assert filters.rollback_restored(T13, previous, after, {"changed": True}, None)
    stuck = {"cuda_selected_path": "/usr/local/cuda-13.0", "nvcc_release": None}
    report = filters.rollback_report(T13, previous, FAILURE, stuck, {"failed": True, "msg": "lock"}, None, "ct129",
                                     state_file="/var/lib/servelab/cuda_toolkit-rollback.json")
    assert ("NOT as it was before the interrupted run of 2026-12-03T14:30:00Z: check it by hand; the state to restore "
            "stays in /var/lib/servelab/cuda_toolkit-rollback.json, so the next run puts it back") in report


def test_rollback_report_of_the_whole_stack_puts_the_other_roles_first_and_needs_them_back():
    after = {"cuda_selected_path": "/usr/local/cuda-12.8", "nvcc_release": "12.8"}
    venv = {"restored": True, "text": "the SGLang venv /opt/sglang/venv put back: the venv directory, as before"}
    report = filters.rollback_report(T13, PREVIOUS, FAILURE, after, {"changed": True}, None, "ct129", others=[venv])
    assert ("Rollback: the SGLang venv /opt/sglang/venv put back: the venv directory, as before; /usr/local/cuda -> "
            "/usr/local/cuda-12.8 (nvcc release 12.8, as before); cuda-toolkit-13-0 removed") in report
    assert "The host is as it was before this run." in report
    # The toolkit is back but the venv is not: not "as it was".
    stuck = {"restored": False, "text": "the SGLang venv /opt/sglang/venv could NOT be put back (x): it is absent"}
    report = filters.rollback_report(T13, PREVIOUS, FAILURE, after, {"changed": True}, None, "ct129", others=[stuck])
    assert "could NOT be put back" in report and "The host is NOT as it was before this run: check it by hand" in report


def test_systemd_drop_in_gives_every_service_the_toolkit_environment():
    """templates/servelab-cuda-systemd.conf.j2: the manager's DefaultEnvironment, one quoted assignment each."""
    from pathlib import Path

    import jinja2

    template = Path(__file__).resolve().parents[2] / "roles/cuda_toolkit/templates/servelab-cuda-systemd.conf.j2"
    env = {"CUDA_HOME": "/usr/local/cuda", "PATH": "/usr/local/cuda/bin:/usr/bin:/bin",
           "LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}
    text = jinja2.Template(template.read_text(), keep_trailing_newline=True).render(
        ansible_managed="Ansible managed", cuda_toolkit_link="/usr/local/cuda", cuda_toolkit_env=env)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines == ["[Manager]", 'DefaultEnvironment="CUDA_HOME=/usr/local/cuda" '
                     '"LD_LIBRARY_PATH=/usr/local/cuda/lib64" "PATH=/usr/local/cuda/bin:/usr/bin:/bin"']


def test_the_failure_reason_leads_with_apts_own_words():
    from ansible_collections.servelab.serving.plugins.filter.cuda_toolkit import failure_reason
    # apt-get install --simulate of a version the repository lacks: the command module says only "non-zero return code".
    missing = {"msg": "non-zero return code", "rc": 100, "stdout": "Reading package lists...\\n",
               "stderr": "E: Version '13.0.9-1' for 'cuda-toolkit-13-0' was not found\n"}
    assert failure_reason(missing) == "E: Version '13.0.9-1' for 'cuda-toolkit-13-0' was not found"
    # A full disk: the apt module's msg starts with debconf's warning.
    full = {"msg": "'/usr/bin/apt-get -y install cuda-toolkit-13-0=13.0.1-1' failed: debconf: delaying package "
                   "configuration, since apt-utils is not installed\ndpkg: error processing archive x.deb (--unpack):\n"
                   " cannot copy extracted data for './usr/local/cuda-13.0/lib64/libx.so': failed to write "
                   "(No space left on device)\nE: Sub-process /usr/bin/dpkg returned an error code (1)\n"}
    reason = failure_reason(full)
    assert reason.startswith("cannot copy extracted data") and "No space left on device" in reason, reason
    assert "debconf" not in reason
    # Not apt: Ansible's own message.
    assert failure_reason({"msg": "CUDA 13.0.1 on ct129: nvcc failed"}) == "CUDA 13.0.1 on ct129: nvcc failed"
    assert failure_reason({"msg": "non-zero return code", "stderr": "boom\n"}) == "boom"


def test_the_recorded_rollback_state_is_read_back_or_refused():
    import base64
    import json as _json

    import pytest as _pytest
    from ansible.errors import AnsibleFilterError

    state = {"package_version": "", "selected_path": "/usr/local/cuda-12.8", "selected": "12.8", "status": "auto",
             "fact": "", "facts": {}, "systemd_env_existed": False, "recorded": "2026-12-03T14:30:00Z",
             "target": "cuda-toolkit-13-0=13.0.1-1"}
    encoded = base64.b64encode(_json.dumps(state).encode()).decode()
    back = filters.rollback_state(encoded, "/var/lib/servelab/x.json")
    assert back["selected_path"] == "/usr/local/cuda-12.8" and back["recorded"] == "2026-12-03T14:30:00Z"
    assert "target" not in back
    for bad in (base64.b64encode(b"{not json").decode(), base64.b64encode(b'{"selected_path": "x"}').decode()):
        with _pytest.raises(AnsibleFilterError, match=r"/var/lib/servelab/x.json is not a rollback state .* delete the file"):
            filters.rollback_state(bad, "/var/lib/servelab/x.json")
