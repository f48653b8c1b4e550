"""The reaper against real processes holding stand-in device files (no GPU needed).

Every test uses device files in its own scratch dir and patterns carrying a random token, so
nothing but the test's own processes can match; the Spawner kills whatever is left by PID.
"""
from __future__ import annotations

import os
import stat
import sys
import time
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_reap_helpers import alive, all_pids, wait_until  # noqa: E402

from ansible_collections.servelab.serving.plugins.module_utils.proc.devices import DeviceMatcher, find_device_holders  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import scan_processes  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap import ReapInputError, ReapOptions, reap  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.cgroup import v2_root  # noqa: E402


def opts(sp, **kw) -> ReapOptions:
    """Options confined to the test: its device files, no patterns, no GPU. The stand-in
    holders are CUDA-like (they hold the nvidia-uvm stand-in) unless a test says otherwise."""
    base = dict(device_glob=sp.device_glob, compute_device_glob=sp.compute_glob, patterns=[],
                grace=5.0, kill_timeout=10.0, gpu_backend="none")
    base.update(kw)
    return ReapOptions(**base)


def cuda(sp):
    """Holder arguments of a CUDA-like process: the GPU node open, the UVM node mapped (what a
    CUDA context does; an NVML client opens both and maps neither)."""
    return ["--hold", sp.dev("nvidia0"), "--map-only", sp.dev("nvidia-uvm")]


def nvml_like(sp):
    return ["--hold", sp.dev("nvidiactl"), "--hold", sp.dev("nvidia0"),
            "--hold", sp.dev("nvidia-uvm")]


def by_pid(reports):
    return {r.pid: r for r in reports}


def test_fd_scan_finds_holders_by_fd_and_by_mapping_only(sp):
    holder = sp.start("holder", *cuda(sp))
    mapper = sp.start("mapper", "--map-only", sp.dev("nvidiactl"))
    other = sp.start("other", "--hold", sp.dev("other0"))
    table = scan_processes()
    hits = find_device_holders(table, DeviceMatcher.from_glob(sp.device_glob))
    assert hits[holder["pid"]].how == "device_fd"
    assert hits[holder["pid"]].paths == [sp.dev("nvidia0")]
    assert hits[mapper["pid"]].how == "device_mmap"
    assert other["pid"] not in hits, "a process holding a file outside the glob was matched"
    no_maps = find_device_holders(table, DeviceMatcher.from_glob(sp.device_glob), scan_maps=False)
    assert mapper["pid"] not in no_maps


def test_holders_without_a_cuda_context_are_spared(sp):
    # like nvidia-smi / a DCGM exporter: GPU nodes open, uvm included, but nothing mapped
    monitor = sp.start("monitor", *nvml_like(sp))
    worker = sp.start("worker", *cuda(sp))
    res = reap(opts(sp))
    assert [r.pid for r in res.killed] == [worker["pid"]]
    assert alive(monitor["pid"])
    reason = {s["pid"]: s["reason"] for s in res.spared}[monitor["pid"]]
    assert "has no CUDA context" in reason
    # without the compute filter every holder counts, as with fuser
    res = reap(opts(sp, compute_device_glob=""))
    assert [r.pid for r in res.killed] == [monitor["pid"]]


def test_tree_orphans_and_groups_are_reaped_decoy_is_not(sp):
    # A launcher (matched by pattern) with two GPU workers; worker 1 has a CPU-only helper child.
    # The launcher dies first, as in the field: its tree is reparented to init.
    launcher = sp.start(
        "launcher",
        "--child", sp.child("worker0", *cuda(sp)),
        "--child", sp.child("worker1", *cuda(sp),
                            "--child", sp.child("helper")),
        "--child", sp.child("cpuorphan"))
    decoy = sp.start("decoy")
    lpid = launcher["pid"]
    worker0, worker1, cpuorphan = launcher["children"]
    helper = worker1["children"][0]
    launcher["popen"].kill()
    launcher["popen"].wait(timeout=30)
    wait_until(lambda: not alive(lpid), what="launcher to die")

    res = reap(opts(sp, patterns=[sp.token + "-launcher"]))
    killed = by_pid(res.killed)
    assert killed[worker0["pid"]].found_by == "device_fd"
    assert killed[worker1["pid"]].found_by == "device_fd"
    assert killed[helper["pid"]].found_by == "descendant"
    assert killed[helper["pid"]].seed_pid == worker1["pid"]
    # holds nothing, matches nothing: found only as a member of the dead launcher's group
    assert killed[cpuorphan["pid"]].found_by == "process_group"
    assert all(r.signal == "SIGTERM" for r in res.killed)
    assert res.changed and not res.survivors
    for info in (worker0, worker1, helper, cpuorphan):
        assert not alive(info["pid"]), "%d still running" % info["pid"]
    assert alive(decoy["pid"]), "the unrelated decoy was killed"
    assert decoy["pid"] not in killed


def test_live_launcher_session_is_reaped_with_its_members(sp):
    launcher = sp.start("launcher", "--child", sp.child("worker", *cuda(sp)),
                        "--child", sp.child("tokenizer"))
    worker, tokenizer = launcher["children"]
    # pattern_scope own_gpu (default): the CPU-only launcher started by hand (no servelab
    # cgroup) is only a name; the GPU worker is taken, the launcher's session is not
    res = reap(opts(sp, patterns=[sp.token + "-launcher"]))
    assert set(by_pid(res.killed)) == {worker["pid"]}
    assert alive(launcher["pid"]) and alive(tokenizer["pid"])
    assert "holds no CUDA context" in {s["pid"]: s["reason"]
                                       for s in res.spared}[launcher["pid"]]
    # own: the reaping user's match is enough; its session comes with it
    res = reap(opts(sp, patterns=[sp.token + "-launcher"], pattern_scope="own"))
    killed = by_pid(res.killed)
    assert killed[launcher["pid"]].found_by == "pattern"
    assert tokenizer["pid"] in killed and not alive(tokenizer["pid"])


def test_sigterm_ignored_escalates_to_sigkill(sp):
    stubborn = sp.start("stubborn", "--ignore-term", *cuda(sp))
    polite = sp.start("polite", *cuda(sp))
    res = reap(opts(sp, grace=0.5))
    killed = by_pid(res.killed)
    assert killed[stubborn["pid"]].signal == "SIGKILL"
    assert killed[polite["pid"]].signal == "SIGTERM"
    assert not alive(stubborn["pid"]) and not alive(polite["pid"])
    assert res.phases["terminate_s"] >= 0.5 - 0.05   # the stubborn one used the grace period


def test_a_target_that_leaves_on_its_own_is_vanished_not_killed(sp):
    # ignores SIGTERM and exits by itself during the grace: no signal of ours ended it
    leaver = sp.start("leaver", "--ignore-term", "--exit-after", "1.5", *cuda(sp))
    res = reap(opts(sp, grace=20))
    assert [r.pid for r in res.vanished] == [leaver["pid"]]
    assert res.vanished[0].signal is None and res.vanished[0].found_by == "device_fd"
    assert res.killed == [] and res.survivors == [] and not res.changed
    assert res.phases["terminate_s"] < 10, "the grace wait did not end when it left"


def test_double_forked_setsid_grandchild_holding_the_device_is_reaped(sp):
    parent = sp.start("parent", "--double-fork", sp.child("escapee", *cuda(sp)))
    escapee = parent["detached"][0]
    # the classic daemon: the middle process setsid()s and exits, so the grandchild sits in a
    # session of its own whose leader is gone, reparented away from `parent`
    assert escapee["sid"] != parent["sid"], "grandchild did not leave the parent's session"
    assert escapee["sid"] != escapee["pid"]
    assert _ppid(escapee["pid"]) != parent["pid"]
    res = reap(opts(sp))
    killed = by_pid(res.killed)
    assert killed[escapee["pid"]].found_by == "device_fd"
    assert not alive(escapee["pid"])
    assert parent["pid"] not in killed, "the parent holds no device and matches nothing"
    assert alive(parent["pid"])


def test_check_mode_kills_nothing_and_lists_targets(sp):
    worker = sp.start("worker", *cuda(sp), "--child", sp.child("sub"))
    res = reap(opts(sp, check_mode=True))
    would = by_pid(res.would_kill)
    assert set(would) == set(all_pids(worker))
    assert would[worker["children"][0]["pid"]].found_by == "descendant"
    assert res.killed == [] and not res.changed
    for pid in all_pids(worker):
        assert alive(pid), "check mode killed %d" % pid


def test_protect_pattern_and_pid_spare_process_and_descendants(sp):
    keep = sp.start("keepme", *cuda(sp),
                    "--child", sp.child("keepchild", *cuda(sp)))
    keep_pid = sp.start("keepbypid", *cuda(sp))
    victim = sp.start("victim", *cuda(sp))
    res = reap(opts(sp, protect=[sp.token + "-keepme"], protect_pids=[keep_pid["pid"]]))
    assert set(by_pid(res.killed)) == {victim["pid"]}
    for pid in all_pids(keep) + [keep_pid["pid"]]:
        assert alive(pid), "protected %d was killed" % pid
    spared = {s["pid"]: s["reason"] for s in res.spared}
    assert "protect pattern" in spared[keep["pid"]]
    assert "descendant of protected" in spared[keep["children"][0]["pid"]]
    assert spared[keep_pid["pid"]] == "protect_pids"


def test_own_process_and_ancestry_are_never_selected(sp):
    # This test process holds a device file too, and the pattern matches every python process.
    with open(sp.dev("nvidia0"), "rb"):
        worker = sp.start("worker")
        res = reap(opts(sp, patterns=[r"python"], pattern_scope="any", check_mode=True))
    would = by_pid(res.would_kill)
    assert worker["pid"] in would
    me = os.getpid()
    assert me not in would
    pid = me
    while pid > 1:
        pid = _ppid(pid)
        assert pid not in would, "ancestor %d selected" % pid
    assert any(s["pid"] == me for s in res.spared)


def test_a_zombie_we_do_not_reap_counts_as_gone(sp):
    # The worker is this test's child and nobody wait()s it during the reap: it stays a zombie.
    worker = sp.start("worker", *cuda(sp))
    res = reap(opts(sp))
    assert [r.pid for r in res.killed] == [worker["pid"]]
    assert res.survivors == []
    assert _state(worker["pid"]) == "Z"


def test_rerun_finds_nothing_and_changes_nothing(sp):
    sp.start("worker", *cuda(sp))
    first = reap(opts(sp))
    second = reap(opts(sp))
    assert first.changed and len(first.killed) == 1
    assert not second.changed and second.killed == [] and second.would_kill == []


# ---------------------------------------------------------------------------------------------
# GPU memory polling against a stand-in nvidia-smi. It lists each pid of its pid file on GPU 0
# while that process lives, with 4000 MiB or the MiB given as PID:MIB; PID:MIB:stuck stays
# listed after the process is gone (a context the driver has not torn down).

FAKE_SMI = r'''#!%(python)s
import os, sys
def live(pid):
    try:
        with open("/proc/%%s/stat" %% pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
entries = [(x.split(":") + ["4000", ""])[:3] for x in open(%(pidfile)r).read().split()]
held = [(int(p), int(mib)) for p, mib, how in entries if how == "stuck" or live(int(p))]
args = " ".join(sys.argv[1:])
gpus = [{"index": "0", "uuid": "GPU-fake-0", "memory.used": str(sum(m for _, m in held))}]
if %(other_mib)d:     # a second GPU, busy with another container's work (a host PID)
    gpus.append({"index": "1", "uuid": "GPU-fake-1", "memory.used": "%(other_mib)d"})
if "--query-gpu" in args:
    fields = args.split("--query-gpu=")[1].split()[0].split(",")
    for g in gpus:
        vals = dict(name="Fake GPU", compute_cap="9.0", driver_version="580.82.07", **g)
        vals["memory.total"] = "81559"
        print(", ".join(vals[f] for f in fields))
elif "--query-compute-apps" in args:
    for p, mib in held:
        print("GPU-fake-0, %%d, %%d" %% (p, mib))
    if %(other_mib)d:
        print("GPU-fake-1, 999999, %(other_mib)d")
else:
    print("| NVIDIA-SMI 580.82.07   Driver Version: 580.82.07   CUDA Version: 13.0 |")
'''


def _fake_smi(sp, pids, other_mib=0):
    """pids: PID, "PID:MIB" or "PID:MIB:stuck" (see FAKE_SMI)."""
    pidfile = os.path.join(sp.dir, "smi-pids")
    with open(pidfile, "w") as fh:
        fh.write(" ".join(str(p) for p in pids))
    path = os.path.join(sp.dir, "nvidia-smi")
    with open(path, "w") as fh:
        fh.write(FAKE_SMI % {"python": sys.executable, "pidfile": pidfile,
                             "other_mib": other_mib})
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


def test_memory_is_polled_back_to_clean(sp):
    w1 = sp.start("w1", *cuda(sp))
    w2 = sp.start("w2", *cuda(sp))
    smi = _fake_smi(sp, [w1["pid"], w2["pid"]])
    res = reap(opts(sp, gpu_backend="nvidia-smi", nvidia_smi=smi, memory_timeout=60))
    assert res.memory_source == "nvidia-smi"
    assert res.memory_before[0].used_mib == 8000 and res.memory_before[0].processes == 2
    assert res.memory_after[0].used_mib == 0 and res.memory_after[0].processes == 0
    assert res.memory_clean is True


def test_memory_of_protected_work_is_left_out_of_the_check(sp):
    # the field case: a protected job holds 2000 MiB; without a baseline the GPU used to
    # look busy forever ("GPU memory not back to baseline") and every profile failed
    keep = sp.start("keep", *cuda(sp))
    victim = sp.start("victim", *cuda(sp))
    smi = _fake_smi(sp, ["%d:2000" % keep["pid"], "%d:6000" % victim["pid"]])
    res = reap(opts(sp, protect=[sp.token + "-keep"], gpu_backend="nvidia-smi", nvidia_smi=smi,
                    memory_timeout=10))
    assert [r.pid for r in res.killed] == [victim["pid"]]
    assert res.memory_after[0].used_mib == 2000 and res.memory_after[0].processes == 1
    assert res.memory_clean is True
    excl = res.memory_excluded[0]
    assert excl.index == 0 and excl.excluded_mib == 2000
    assert [(p.pid, p.used_mib) for p in excl.processes] == [(keep["pid"], 2000)]
    assert excl.processes[0].reason.startswith("protect pattern")
    assert res.memory_note is None
    # the memory counts again once the process is no longer spared: a baseline must cover it
    again = reap(opts(sp, gpu_backend="nvidia-smi", nvidia_smi=smi, memory_timeout=0.3,
                      check_mode=True))
    assert {r.pid for r in again.would_kill} == {keep["pid"]}
    assert again.memory_clean is False and again.memory_excluded[0].excluded_mib == 0


def test_memory_of_a_leftover_is_not_left_out(sp):
    keep = sp.start("keep", *cuda(sp))
    victim = sp.start("victim", *cuda(sp))
    # the victim's context stays listed after it died; and a pid that is no process here
    # (another container's, or a host pid seen from inside a container)
    smi = _fake_smi(sp, ["%d:2000" % keep["pid"], "%d:3000:stuck" % victim["pid"],
                         "999999:1500:stuck"])
    res = reap(opts(sp, protect=[sp.token + "-keep"], gpu_backend="nvidia-smi", nvidia_smi=smi,
                    memory_timeout=0.3))
    assert [r.pid for r in res.killed] == [victim["pid"]] and not alive(victim["pid"])
    assert res.memory_clean is False, "a dead target's 3000 MiB are still on the GPU"
    assert [p.pid for p in res.memory_excluded[0].processes] == [keep["pid"]]
    assert "999999" in res.memory_note and "host pids" in res.memory_note
    # with a baseline for the foreign 1500 MiB, the dead target's memory still fails it
    res = reap(opts(sp, protect=[sp.token + "-keep"], gpu_backend="nvidia-smi", nvidia_smi=smi,
                    memory_timeout=0.3, memory_baseline_mib=1500, memory_threshold_mib=100))
    assert res.memory_clean is False
    _fake_smi(sp, ["%d:2000" % keep["pid"], "999999:1500:stuck"])     # the driver freed it
    res = reap(opts(sp, protect=[sp.token + "-keep"], gpu_backend="nvidia-smi", nvidia_smi=smi,
                    memory_timeout=0.3, memory_baseline_mib=1500, memory_threshold_mib=100))
    assert res.memory_clean is True


def test_gpus_option_limits_the_memory_check_to_the_given_gpus(sp):
    worker = sp.start("worker", *cuda(sp))
    smi = _fake_smi(sp, [worker["pid"]], other_mib=5000)
    common = dict(gpu_backend="nvidia-smi", nvidia_smi=smi, memory_timeout=0.3)
    res = reap(opts(sp, **common))
    assert res.memory_clean is False, "GPU1 keeps 5000 MiB: all GPUs cannot be clean"
    assert [g.index for g in res.memory_after] == [0, 1]
    res = reap(opts(sp, gpus=["GPU-fake-0"], **common))
    assert [g.index for g in res.memory_after] == [0] and res.memory_clean is True
    with pytest.raises(ReapInputError, match="gpus: none of"):
        reap(opts(sp, gpus=["7"], **common))
    with pytest.raises(ReapInputError, match="gpus: 'first' is neither"):
        reap(opts(sp, gpus=["first"], **common))


def test_device_nodes_are_matched_by_device_number_too(sp):
    # a node with /dev/zero's numbers under the glob stands in for the GPU node; the process
    # holds /dev/zero (another path, same device), as a container's node may read back on the host
    node = sp.dev("nvidia-zero")
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    except OSError as exc:
        pytest.skip("cannot mknod here: %s" % exc)
    elsewhere = os.path.join(sp.dir, "renamed-node")
    os.mknod(elsewhere, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    a = sp.start("a", "--hold", "/dev/zero")
    b = sp.start("b", "--hold", elsewhere)
    matcher = DeviceMatcher.from_glob(sp.device_glob)
    hits = find_device_holders([a["pid"], b["pid"]], matcher, scan_maps=False)
    assert hits[a["pid"]].paths == ["/dev/zero"]
    assert b["pid"] not in hits, "outside /dev only the host variant compares device numbers"
    matcher.stat_all = True
    hits = find_device_holders([a["pid"], b["pid"]], matcher, scan_maps=False)
    assert hits[b["pid"]].paths == [elsewhere]


# ---------------------------------------------------------------------------------------------
# cgroups


def test_cgroup_members_are_reaped_with_cgroup_kill(sp):
    root = v2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy here")
    cg = os.path.join(root, "servelab-reaptest-" + uuid.uuid4().hex[:8])
    try:
        os.mkdir(cg)
    except OSError as exc:
        pytest.skip("cannot create a cgroup under %s: %s" % (root, exc))
    try:
        if not os.path.exists(os.path.join(cg, "cgroup.kill")):
            pytest.skip("no cgroup.kill (kernel < 5.14)")
        # a server in the cgroup: ignores SIGTERM; a double-forked escapee that holds nothing and
        # matches nothing: only the cgroup knows it belongs to the server
        server = sp.start("server", "--cgroup", cg, "--ignore-term",
                          "--double-fork", sp.child("escapee", "--ignore-term"))
        escapee = server["detached"][0]
        res = reap(opts(sp, cgroups=[cg], grace=0.3))
        killed = by_pid(res.killed)
        assert killed[server["pid"]].found_by == "cgroup"
        assert killed[escapee["pid"]].found_by == "cgroup"
        assert killed[server["pid"]].signal == "cgroup.kill"
        assert killed[escapee["pid"]].signal == "cgroup.kill"
        assert res.cgroups[0].killed_with_cgroup_kill
        assert not alive(server["pid"]) and not alive(escapee["pid"])
    finally:
        sp.cleanup()
        _remove_cgroup(cg)


def test_cgroup_with_a_protected_member_is_not_cgroup_killed(sp):
    root = v2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy here")
    cg = os.path.join(root, "servelab-reaptest-" + uuid.uuid4().hex[:8])
    try:
        os.mkdir(cg)
    except OSError as exc:
        pytest.skip("cannot create a cgroup under %s: %s" % (root, exc))
    try:
        keep = sp.start("keep", "--cgroup", cg)
        victim = sp.start("victim", "--cgroup", cg, "--ignore-term")
        res = reap(opts(sp, cgroups=[cg], protect=[sp.token + "-keep"], grace=0.3))
        assert set(by_pid(res.killed)) == {victim["pid"]}
        assert by_pid(res.killed)[victim["pid"]].signal == "SIGKILL"
        assert alive(keep["pid"])
        assert not res.cgroups[0].killed_with_cgroup_kill
        assert "protected" in res.cgroups[0].note
    finally:
        sp.cleanup()
        _remove_cgroup(cg)


def test_missing_cgroup_is_reported_not_fatal(sp):
    res = reap(opts(sp, cgroups=["servelab/no-such-server-" + sp.token]))
    assert res.cgroups and res.cgroups[0].exists is False


# ---------------------------------------------------------------------------------------------
# Host variant: only the container's processes (a stand-in cgroup tree lists them)


def test_container_scope_limits_candidates_to_its_cgroup(sp):
    inside = sp.start("inside", *cuda(sp))
    outside = sp.start("outside", *cuda(sp))
    ns = os.path.join(sp.dir, "cg", "lxc", "129", "ns")
    os.makedirs(ns)
    with open(os.path.join(ns, "cgroup.procs"), "w") as fh:
        fh.write("%d\n" % inside["pid"])
    with open(os.path.join(sp.dir, "cg", "lxc", "129", "cgroup.procs"), "w") as fh:
        fh.write("")
    globs = [os.path.join(sp.dir, "cg", "lxc", "{vmid}")]
    res = reap(opts(sp, container="129", container_cgroup_globs=globs))
    assert [r.pid for r in res.killed] == [inside["pid"]]
    assert res.killed[0].container_pid == inside["pid"]   # no pid namespace here: same number
    assert res.container_cgroups == [os.path.join(sp.dir, "cg", "lxc", "129")]
    assert alive(outside["pid"]), "a process outside the container was killed"
    with pytest.raises(ReapInputError, match="container: no cgroup directory of container 130"):
        reap(opts(sp, container="130", container_cgroup_globs=globs))


# ---------------------------------------------------------------------------------------------
# Bad input: a clear error naming the option, before anything is signalled


@pytest.mark.parametrize("kw, needle", [
    (dict(patterns=["("]), "patterns: '(' is not a valid regular expression"),
    (dict(protect=["[a-"]), "protect:"),
    (dict(grace=-1), "grace: must be >= 0"),
    (dict(device_glob="dev/nvidia*"), "device_glob:"),
    (dict(compute_device_glob="nvidia-uvm"), "compute_device_glob:"),
    (dict(memory_baseline_mib="lots"), "memory_baseline_mib:"),
    (dict(memory_baseline_mib={"0": "x"}), "memory_baseline_mib:"),
    (dict(container="ct129"), "container: 'ct129' must be the container's numeric vmid"),
    (dict(gpu_backend="cuda"), "gpu_backend:"),
    (dict(protect_pids=[0]), "protect_pids:"),
])
def test_bad_options_fail_before_anything_is_killed(sp, kw, needle):
    worker = sp.start("worker", *cuda(sp))
    with pytest.raises(ValueError) as err:
        reap(opts(sp, **kw))
    assert needle in str(err.value)
    assert alive(worker["pid"])


def _ppid(pid: int) -> int:
    with open("/proc/%d/stat" % pid) as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _state(pid: int) -> str:
    with open("/proc/%d/stat" % pid) as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def _remove_cgroup(path: str) -> None:
    """Best effort: a cgroup can be removed once its last zombie is reaped (init does it lazily
    here); a leftover empty test cgroup is harmless."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def test_spared_reason_for_ourselves_is_ourselves(sp):
    with open(sp.dev("nvidia0"), "rb"):          # the reaper holds a GPU node (as NVML does)
        res = reap(opts(sp, check_mode=True))
    assert {s["pid"]: s["reason"] for s in res.spared}[os.getpid()] == "the reaper itself"
