"""servelab's test lab: a disposable "Proxmox host" holding LXC container 129, on this machine.

Topology (see tests/lab/README.md)::

    controller (this machine, root netns)
      sl-lab-ctl 10.77.129.1 ── veth ── eth0 10.77.129.2  "pve1": LXC system container servelab-pve
      apt-cacher-ng :3149 (lab veth only)                 (systemd, sshd, lxc, fake pct/nvidia-smi)
      extra HTTP servers (Lab.serve_directory)             └── container 129 (nested LXC, systemd,
                                                              python3; shares pve1's network)

Python API::

    lab = Lab.up()                          # from nothing or from caches; idempotent, locked
    lab.inventory_path                      # inventory dir: proxmox_hosts, gpu_servers, bench_clients
    lab.run_playbook("playbooks/proxmox.yml", extravars={...}, check=False, diff=False)
    lab.pct_exec(129, "cat", "/etc/os-release")     # CompletedProcess (text)
    lab.pve_exec("ls", "/etc/pve/lxc")
    url = lab.serve_directory("/path/to/apt-repo")  # http://10.77.129.1:<port>/ reachable from ct129
    lab.set_fake_driver("570.172.08")               # what nvidia-smi and /proc stand-ins answer
    lab.down()                                      # nothing left: process, container, link, cgroup

Command line: ``python tests/lab/labctl.py up|down|status|build|run -- CMD...``.

Everything the lab creates carries a servelab-specific name (LXC container servelab-pve under its
own lxcpath /var/lib/servelab-lab/lxc, links sl-lab-*, cgroup servelab-lab, lock
/run/servelab-lab.lock), so stale leftovers of an interrupted run are found and removed by name
without touching anything else. It never writes to this machine's /etc: apt-cacher-ng runs from
a copy of its config, containers are configured inside their own root filesystems.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import ipaddress
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parent
REPO = LAB_DIR.parents[1]
GUEST_FILES = LAB_DIR / "guest"
STATIC_INVENTORY = REPO / "inventory" / "lab"

NAME = "servelab-pve"  # LXC name of the "Proxmox host"
VETH_CTL = "sl-lab-ctl"  # controller end of the lab link
VETH_PVE = "sl-lab-pve"  # becomes eth0 of the Proxmox host
CGROUP_NAME = "servelab-lab"  # helper processes (apt-cacher-ng, HTTP servers, builds) live here
LOCK_PATH = "/run/servelab-lab.lock"

# Stand-in paths inside the Proxmox host (the lab inventory points the role at them).
FAKE_PROC = "/srv/servelab-lab/proc"
FAKE_NVIDIA_JSON = "/etc/servelab-lab/fake-nvidia.json"
PCT_LOG = "/var/log/servelab-lab/pct.log"

# Bump when the package lists or the build steps change: it keys the cached root filesystems.
ROOTFS_FORMAT = 1
PVE_PACKAGES = ("systemd-sysv", "python3", "openssh-server", "lxc", "lxc-templates", "kmod", "iproute2", "procps")
CT_PACKAGES = ("systemd-sysv", "python3", "python3-apt", "procps")

# Host commands the lab needs, and the Debian package of each.
HOST_COMMANDS = {
    "lxc-start": "lxc",
    "debootstrap": "debootstrap",
    "/usr/sbin/apt-cacher-ng": "apt-cacher-ng",
    "ssh": "openssh-client",
    "ip": "iproute2",
    "tar": "tar",
    "gpg": "gpg",  # signs the test APT repositories (tests/lab/aptrepo)
}
PATH_IN_GUEST = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


class LabError(RuntimeError):
    """The lab could not be brought up or torn down; the message says why and what to do."""


class LabUnavailable(LabError):
    """A prerequisite is missing on this machine (not root, no apt, ...): tests skip, or fail under CI."""


def _env_path(name: str, default: str) -> Path:
    return Path(os.environ.get(name) or default)


@dataclasses.dataclass
class LabConfig:
    """Where the lab keeps things and what it plays. Environment variables override the defaults."""

    root: Path = dataclasses.field(default_factory=lambda: _env_path("SERVELAB_LAB_ROOT", "/var/lib/servelab-lab"))
    cache: Path = dataclasses.field(default_factory=lambda: _env_path("SERVELAB_LAB_CACHE", "/var/cache/servelab-lab"))
    state: Path = dataclasses.field(default_factory=lambda: _env_path("SERVELAB_LAB_STATE", str(LAB_DIR / ".state")))
    network: str = dataclasses.field(default_factory=lambda: os.environ.get("SERVELAB_LAB_NET", "10.77.129.0/24"))
    suite: str = dataclasses.field(default_factory=lambda: os.environ.get("SERVELAB_LAB_SUITE", "bookworm"))
    mirror: str = dataclasses.field(default_factory=lambda: os.environ.get("SERVELAB_LAB_MIRROR", "http://deb.debian.org/debian"))
    acng_port: int = 3149
    vmid: int = 129
    pve_hostname: str = "pve1"
    gpus: int = 8
    driver_version: str = "580.95.05"

    def __post_init__(self):
        try:
            net = ipaddress.ip_network(self.network)
        except ValueError as err:
            raise LabError("SERVELAB_LAB_NET=%r is not a network (e.g. 10.77.129.0/24): %s"
                           % (self.network, err)) from err
        if net.version != 4 or net.num_addresses < 4:
            raise LabError("SERVELAB_LAB_NET=%r: need an IPv4 network of at least /30" % self.network)


@dataclasses.dataclass
class FailedTask:
    host: str
    task: str
    msg: str


@dataclasses.dataclass
class PlaybookRun:
    """Outcome of Lab.run_playbook: rc, per-host stats, failures with their messages, full stdout."""

    rc: int
    status: str
    stats: dict
    failures: list
    stdout: str
    artifacts: Path

    def changed(self, host: str | None = None) -> int:
        per_host = self.stats.get("changed", {})
        return per_host.get(host, 0) if host else sum(per_host.values())

    def failed(self, host: str | None = None) -> int:
        per_host = {h: self.stats.get("failures", {}).get(h, 0) + self.stats.get("dark", {}).get(h, 0)
                    for h in set(self.stats.get("failures", {})) | set(self.stats.get("dark", {}))}
        return per_host.get(host, 0) if host else sum(per_host.values())

    def failure_text(self) -> str:
        return "\n".join("%s | %s | %s" % (f.host, f.task, f.msg) for f in self.failures)


# lxc-attach re-executes itself from a sealed memfd (CVE-2019-5736) before it does anything; on a
# loaded CI machine that step has failed now and then with EBUSY. Nothing ran yet, so run it again.
REXEC_FAILED = "Failed to rexec as memfd"
REXEC_ATTEMPTS = 4


def _run(argv, *, timeout=120, check=True, input=None, env=None, capture=True, cwd=None):
    """subprocess.run with the lab's defaults: bounded, text, a clear error on failure."""
    for attempt in range(1, REXEC_ATTEMPTS + 1):
        try:
            result = subprocess.run(argv, input=input, capture_output=capture, text=True, timeout=timeout,
                                    env=env, cwd=cwd, check=False)
        except subprocess.TimeoutExpired as err:
            raise LabError("timed out after %ss: %s" % (timeout, " ".join(map(str, argv)))) from err
        rexec_failed = (result.returncode != 0 and capture and str(argv[0]) == "lxc-attach"
                        and REXEC_FAILED in (result.stderr or ""))
        if not rexec_failed or attempt == REXEC_ATTEMPTS:
            break
        time.sleep(0.2 * attempt)
    if check and result.returncode != 0:
        raise LabError("command failed (rc %s): %s\n%s%s" % (result.returncode, " ".join(map(str, argv)),
                                                             result.stdout or "", result.stderr or ""))
    return result


def _cgroup_v2_root() -> Path | None:
    for path in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (path / "cgroup.procs").exists() and (path / "cgroup.controllers").exists():
            return path
    return None


class Lab:
    """The running lab. Build one with Lab.up(); end it with down() (also on any failure in up)."""

    def __init__(self, config: LabConfig | None = None, log=None):
        self.config = config or LabConfig()
        self._log_fn = log
        self._lock_fd: int | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._servers: dict[str, subprocess.Popen] = {}
        self._majors: dict[str, int] = {}
        self._extra_vmids: set[int] = set()
        net = ipaddress.ip_network(self.config.network)
        hosts = list(net.hosts())
        self.controller_address = str(hosts[0])
        self.pve_address = str(hosts[1])
        self.prefixlen = net.prefixlen

    # ----- paths -----------------------------------------------------------------------------
    @property
    def lxcpath(self) -> Path:
        return self.config.root / "lxc"

    @property
    def pve_rootfs(self) -> Path:
        return self.lxcpath / NAME / "rootfs"

    @property
    def ct_rootfs(self) -> Path:
        return self.container_rootfs(self.config.vmid)

    def container_rootfs(self, vmid: int) -> Path:
        """A nested container's root filesystem, as seen from this machine."""
        return self.pve_rootfs / "var/lib/lxc" / str(vmid) / "rootfs"

    @property
    def vmids(self) -> list[int]:
        """The nested containers that exist now: 129, and those add_container() made."""
        return [self.config.vmid] + sorted(self._extra_vmids)

    @property
    def inventory_path(self) -> Path:
        return self.config.state / "inventory"

    @property
    def ssh_key(self) -> Path:
        return self.config.state / "ssh" / "id_ed25519"

    @property
    def logs(self) -> Path:
        return self.config.state / "logs"

    @property
    def apt_proxy(self) -> str:
        return "http://%s:%d" % (self.controller_address, self.config.acng_port)

    def pve_path(self, path: str) -> Path:
        """A path inside the Proxmox host's root filesystem, as seen from this machine."""
        return self.pve_rootfs / path.lstrip("/")

    def ct_path(self, path: str, vmid: int | None = None) -> Path:
        """A path inside container 129's (or vmid's) root filesystem, as seen from this machine."""
        return self.container_rootfs(vmid or self.config.vmid) / path.lstrip("/")

    def pve_config_path(self, vmid: int | None = None) -> Path:
        return self.pve_path("/etc/pve/lxc/%d.conf" % (vmid or self.config.vmid))

    def pristine_pve_config(self, vmid: int | None = None) -> str:
        """Container 129's (or vmid's) PVE config as the lab creates it (no GPU lines), in PVE's own layout."""
        vmid = vmid or self.config.vmid
        return ("arch: amd64\ncores: 8\nfeatures: nesting=1\nhostname: ct%d\nmemory: 16384\n"
                # The MAC's last bytes spell the vmid in decimal digits, as 4A:01:29 for 129.
                "net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:4A:%02d:%02d,ip=dhcp,type=veth\n"
                "ostype: debian\nrootfs: local-lvm:vm-%d-disk-0,size=64G\nswap: 0\n"
                % (vmid, vmid // 100 % 100, vmid % 100, vmid))

    def reset_pve_config(self, text: str | None = None, vmid: int | None = None) -> None:
        """Write container 129's (or vmid's) PVE config (default: the pristine one). Applies at its next start."""
        self._write(self.pve_config_path(vmid), self.pristine_pve_config(vmid) if text is None else text, 0o640)

    # ----- lifecycle -------------------------------------------------------------------------
    @classmethod
    def up(cls, config: LabConfig | None = None, *, lock_timeout: float = 900.0, log=None,
           install_packages: bool = True) -> Lab:
        """Bring the lab up (cleaning stale leftovers first). Any failure tears down what was built."""
        lab = cls(config, log=log)
        check_prerequisites(install=install_packages, log=lab._say)
        lab._acquire_lock(lock_timeout)
        try:
            lab._up()
        except BaseException:
            lab.down()
            raise
        return lab

    def _up(self):
        started = time.monotonic()
        for path in (self.config.state, self.logs, self.config.cache, self.config.root):
            path.mkdir(parents=True, exist_ok=True)
        self._say("cleaning leftovers of earlier runs")
        self._teardown()
        self._ensure_cgroup()
        self._network_up()
        self._start_acng()
        tarballs = self._ensure_rootfs()
        self._say("unpacking root filesystems")
        self._unpack(tarballs["pve"], self.pve_rootfs)
        self._unpack(tarballs["ct"], self.ct_rootfs)
        self._configure_pve()
        self._configure_ct()
        self.set_fake_driver(self.config.driver_version)
        self._write_inventory()
        self._start_pve()
        self.pct("start", str(self.config.vmid))
        self._wait_systemd(lambda argv: self.pct_exec(self.config.vmid, *argv, check=False, timeout=20),
                           "container %d" % self.config.vmid)
        self._say("lab up in %.0f s: inventory %s" % (time.monotonic() - started, self.inventory_path))

    def down(self) -> None:
        """Tear everything down (idempotent) and release the lock."""
        try:
            self._teardown()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def leftovers(self) -> list[str]:
        """What of a lab exists on this machine right now (empty after down())."""
        found = []
        if self._container_running():
            found.append("container %s is running" % NAME)
        for link in (VETH_CTL, VETH_PVE):
            if Path("/sys/class/net", link).exists():
                found.append("link %s" % link)
        cg = self._cgroup_path()
        if cg and cg.exists():
            procs = (cg / "cgroup.procs").read_text().split()
            found.append("cgroup %s (%d processes)" % (cg, len(procs)))
        for hierarchy in Path("/sys/fs/cgroup").glob("*"):
            for path in list(hierarchy.rglob("lxc.*.%s" % NAME))[:3]:
                found.append("cgroup %s" % path)
        if (self.lxcpath / NAME).exists():
            found.append("directory %s" % (self.lxcpath / NAME))
        for name, proc in list(self._procs.items()) + list(self._servers.items()):
            if proc.poll() is None:
                found.append("process %s (pid %d)" % (name, proc.pid))
        return found

    # ----- commands inside the lab -----------------------------------------------------------
    def pve_exec(self, *argv, check: bool = True, timeout: float = 120, input: str | None = None):
        """Run argv inside the Proxmox host (lxc-attach, root, clean environment)."""
        return _run(["lxc-attach", "-P", str(self.lxcpath), "-n", NAME, "--clear-env",
                     "-v", "PATH=" + PATH_IN_GUEST, "-v", "HOME=/root", "--"] + [str(a) for a in argv],
                    timeout=timeout, check=check, input=input)

    def pct(self, *args, check: bool = True, timeout: float = 180):
        """Run the Proxmox host's pct (the lab's stand-in) with args."""
        return self.pve_exec("pct", *args, check=check, timeout=timeout)

    def pct_exec(self, vmid: int, *argv, check: bool = True, timeout: float = 120, input: str | None = None):
        """Run argv inside container vmid, through the Proxmox host's `pct exec`."""
        return self.pve_exec("pct", "exec", str(vmid), "--", *argv, check=check, timeout=timeout, input=input)

    def pct_log(self) -> list[list[str]]:
        """Every pct call so far, as argument lists (["pct", "reboot", "129", ...])."""
        path = self.pve_path(PCT_LOG)
        if not path.exists():
            return []
        return [line.split()[1:] for line in path.read_text().splitlines() if line.strip()]

    def ansible_env(self) -> dict:
        """Environment for ansible / testinfra subprocesses against the lab."""
        env = dict(os.environ)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
        env["ANSIBLE_INVENTORY"] = str(self.inventory_path)
        env.setdefault("ANSIBLE_NOCOLOR", "1")
        env.pop("ANSIBLE_STDOUT_CALLBACK", None)
        return env

    def run_playbook(self, playbook, *, extravars: dict | None = None, limit: str | None = None,
                     check: bool = False, diff: bool = False, tags: str | None = None,
                     skip_tags: str | None = None, verbosity: int = 0, timeout: int = 900,
                     inventory=None) -> PlaybookRun:
        """Run a playbook (path relative to the repo, or absolute) against the lab inventory
        (or `inventory`, e.g. one from fleet_inventory())."""
        import ansible_runner  # controller-side dependency (requirements-dev.txt); imported late for the CLI

        path = Path(playbook)
        if not path.is_absolute():
            path = REPO / path
        if not path.is_file():
            raise LabError("playbook %s does not exist" % path)
        cmdline = []
        if check:
            cmdline.append("--check")
        if diff:
            cmdline.append("--diff")
        if tags:
            cmdline += ["--tags", tags]
        if skip_tags:
            cmdline += ["--skip-tags", skip_tags]
        # A private data dir per run: ansible-runner would otherwise reuse the env/cmdline
        # (e.g. --check) and env/extravars an earlier run left there.
        runs = self.config.state / "runner"
        runs.mkdir(parents=True, exist_ok=True)
        for old in sorted(runs.glob("run-*"))[:-19]:
            shutil.rmtree(old, ignore_errors=True)
        runner_dir = runs / ("run-%s-%06d" % (time.strftime("%Y%m%d-%H%M%S"), os.getpid() % 1000000))
        suffix = 0
        while (runner_dir.parent / ("%s-%d" % (runner_dir.name, suffix))).exists():
            suffix += 1
        runner_dir = runner_dir.parent / ("%s-%d" % (runner_dir.name, suffix))
        runner_dir.mkdir()
        env = self.ansible_env()
        result = ansible_runner.run(
            private_data_dir=str(runner_dir),
            project_dir=str(REPO),
            playbook=str(path),
            inventory=str(inventory or self.inventory_path),
            extravars=extravars or {},
            limit=limit,
            cmdline=" ".join(cmdline) or None,
            envvars={k: env[k] for k in ("PATH", "ANSIBLE_CONFIG", "ANSIBLE_NOCOLOR")},
            verbosity=verbosity,
            quiet=True,
            timeout=timeout,
        )
        failures = []
        for event in result.events:
            if event.get("event") in ("runner_on_failed", "runner_on_unreachable", "runner_item_on_failed"):
                data = event.get("event_data", {})
                if data.get("ignore_errors"):
                    continue
                res = data.get("res", {})
                failures.append(FailedTask(host=data.get("host", "?"), task=data.get("task", "?"),
                                           msg=str(res.get("msg", res))))
        stdout = result.stdout.read() if result.stdout else ""
        return PlaybookRun(rc=result.rc, status=result.status, stats=result.stats or {}, failures=failures,
                           stdout=stdout, artifacts=Path(result.config.artifact_dir))

    def pass_through_gpus(self) -> PlaybookRun:
        """Run the proxmox_gpu_passthrough play, so ct129 has its /dev/nvidia* nodes and nvidia-smi works."""
        run = self.run_playbook("playbooks/proxmox.yml")
        if run.rc != 0:
            raise LabError("playbooks/proxmox.yml failed in the lab:\n%s" % (run.failure_text() or run.stdout[-3000:]))
        return run

    def run_testinfra(self, group: str, *paths: str, extra: tuple = (), timeout: int = 900):
        """Run testinfra suites (default: tests/host) against an inventory group of the lab."""
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
                "--hosts=ansible://%s" % group, "--ansible-inventory=%s" % self.inventory_path,
                *(paths or ("tests/host",)), *extra]
        return _run(argv, timeout=timeout, check=False, env=self.ansible_env(), cwd=str(REPO))

    def serve_directory(self, directory, *, name: str | None = None) -> str:
        """Serve a directory over HTTP on the lab link (reachable from the Proxmox host and ct129).

        Returns the base URL (http://<controller address>:<port>/). Stopped by down().
        """
        directory = Path(directory).resolve()
        if not directory.is_dir():
            raise LabError("serve_directory: %s is not a directory" % directory)
        name = name or "http-%s" % directory.name
        code = ("import functools, http.server, sys\n"
                "h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])\n"
                "s = http.server.ThreadingHTTPServer((sys.argv[1], 0), h)\n"
                "print(s.server_address[1], flush=True)\n"
                "s.serve_forever()\n")
        proc = self._spawn(name, [sys.executable, "-c", code, self.controller_address, str(directory)],
                           stdout=subprocess.PIPE)
        self._servers[name] = proc
        ready, _writable, _errored = select.select([proc.stdout], [], [], 15)
        line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        if not line.isdigit():
            raise LabError("HTTP server for %s did not start (see %s)" % (directory, self.logs / ("%s.log" % name)))
        return "http://%s:%s/" % (self.controller_address, line)

    # ----- the fake driver -------------------------------------------------------------------
    def set_fake_driver(self, version: str, *, container_version: str | None = None,
                        gpus: int | None = None, uvm_loaded: bool = True, kernel_version: str | None = None,
                        gpu_name: str | None = None, compute_cap: str = "12.0") -> None:
        """Make the Proxmox host's driver stand-ins answer as `version` with `gpus` GPUs.

        Writes the stand-in /proc/driver/nvidia/version and /proc/devices (with majors free on
        this kernel: 195, and dynamic ones for nvidia-uvm/nvidia-caps), the JSON nvidia-smi and
        nvidia-modprobe read, and container 129's user-space driver version (default: the same).
        uvm_loaded=False leaves nvidia-uvm out of /proc/devices, as before `nvidia-modprobe -u`.
        kernel_version: a loaded kernel module other than the user-space version (an upgrade
        without the reboot). gpu_name / compute_cap: what every GPU reports (default: an RTX PRO 6000
        Blackwell Server Edition, SM 12.0; e.g. "NVIDIA H200", "9.0").
        """
        gpus = self.config.gpus if gpus is None else gpus
        majors = self._pick_majors()
        devices = Path("/proc/devices").read_text().splitlines()
        extra = {majors["nvidia-frontend"]: "nvidia-frontend", majors["nvidia-caps"]: "nvidia-caps"}
        if uvm_loaded:
            extra[majors["nvidia-uvm"]] = "nvidia-uvm"
        char_end = devices.index("") if "" in devices else len(devices)
        char = list(devices[1:char_end])
        char += ["%3d %s" % (major, name) for major, name in extra.items()]
        char.sort(key=lambda line: int(line.split()[0]))
        proc_devices = "\n".join([devices[0]] + char + devices[char_end:]) + "\n"
        version_text = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  "
                        "(servelab-lab@%s)  Thu Nov 27 10:00:00 UTC 2026\nGCC version:  gcc version 12.2.0 "
                        "(Debian 12.2.0-14+deb12u1)\n" % (kernel_version or version, self.config.pve_hostname))
        gpu_list = [dict(name=gpu_name or GPU_NAME, uuid="GPU-5e1ab000-0000-4000-8000-%012d" % index,
                         pci_bus_id="00000000:%02X:00.0" % (0x41 + index), memory_total_mib=97887, compute_cap=compute_cap)
                    for index in range(gpus)]
        host = dict(role="host", driver_version=version, cuda_version="13.0", gpus=gpu_list,
                    proc_devices=FAKE_PROC + "/devices", uvm_major=majors["nvidia-uvm"])
        container = dict(host, role="container", driver_version=container_version or version)
        self._write(self.pve_path(FAKE_PROC + "/devices"), proc_devices)
        self._write(self.pve_path(FAKE_PROC + "/driver/nvidia/version"), version_text)
        self._write(self.pve_path(FAKE_NVIDIA_JSON), json.dumps(host, indent=1) + "\n")
        for vmid in self.vmids:
            self._write(self.ct_path(FAKE_NVIDIA_JSON, vmid), json.dumps(container, indent=1) + "\n")

    @property
    def fake_majors(self) -> dict:
        """Majors the lab's stand-in /proc/devices gives the NVIDIA drivers."""
        return dict(self._pick_majors())

    def _pick_majors(self) -> dict:
        if not self._majors:
            used = set()
            for line in Path("/proc/devices").read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit():
                    used.add(int(parts[0]))
            if 195 in used:
                raise LabError("major 195 is taken on this kernel (%s): the lab's NVIDIA stand-ins need it" %
                               "/proc/devices")
            free = [major for major in range(511, 383, -1) if major not in used]
            self._majors = {"nvidia-frontend": 195, "nvidia-uvm": free[0], "nvidia-caps": free[1]}
        return self._majors

    # ----- build steps -----------------------------------------------------------------------
    def _say(self, message: str) -> None:
        line = "[lab %s] %s" % (time.strftime("%H:%M:%S"), message)
        if self._log_fn:
            self._log_fn(line)
        else:
            print(line, file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            self.logs.mkdir(parents=True, exist_ok=True)
            with open(self.logs / "lab.log", "a", encoding="utf-8") as handle:
                handle.write(line + "\n")

    def _acquire_lock(self, timeout: float) -> None:
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                    os.close(fd)
                    raise LabError("another servelab lab is running (pid %s holds %s); wait for it or end it"
                                   % (holder or "?", LOCK_PATH)) from None
                time.sleep(2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _cgroup_path(self) -> Path | None:
        root = _cgroup_v2_root()
        return root / CGROUP_NAME if root else None

    def _ensure_cgroup(self) -> None:
        path = self._cgroup_path()
        if path is None:
            raise LabUnavailable("no cgroup v2 hierarchy (/sys/fs/cgroup or /sys/fs/cgroup/unified): the lab "
                                 "needs one to end its helper processes reliably")
        path.mkdir(exist_ok=True)

    def _spawn(self, name: str, argv, stdout=None) -> subprocess.Popen:
        """Start a helper process in the lab's cgroup (so teardown can end it and all its children)."""
        procs_file = str(self._cgroup_path() / "cgroup.procs")

        def join_cgroup():
            with open(procs_file, "w") as handle:
                handle.write("0")

        log = open(self.logs / ("%s.log" % name), "ab")
        proc = subprocess.Popen(argv, stdout=stdout or log, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=join_cgroup)
        log.close()
        self._procs[name] = proc
        return proc

    def _run_in_cgroup(self, name: str, argv, timeout: float, env=None) -> None:
        procs_file = str(self._cgroup_path() / "cgroup.procs")

        def join_cgroup():
            with open(procs_file, "w") as handle:
                handle.write("0")

        with open(self.logs / ("%s.log" % name), "ab") as log:
            try:
                result = subprocess.run(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, timeout=timeout,
                                        env=env, preexec_fn=join_cgroup, check=False)
            except subprocess.TimeoutExpired as err:
                raise LabError("%s timed out after %ss (log: %s)" % (name, timeout, self.logs / (name + ".log"))) from err
        if result.returncode != 0:
            tail = (self.logs / ("%s.log" % name)).read_text(errors="replace")[-1500:]
            raise LabError("%s failed (rc %d), log %s:\n%s" % (name, result.returncode, self.logs / (name + ".log"), tail))

    def _network_up(self) -> None:
        net = ipaddress.ip_network(self.config.network)
        addrs = json.loads(_run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]")
        for link in addrs:
            for info in link.get("addr_info", []):
                if ipaddress.ip_address(info["local"]) in net:
                    raise LabError("the lab network %s is already used by %s (%s): set SERVELAB_LAB_NET to a free "
                                   "private /24" % (net, link["ifname"], info["local"]))
        _run(["ip", "link", "add", VETH_CTL, "type", "veth", "peer", "name", VETH_PVE])
        _run(["ip", "addr", "add", "%s/%d" % (self.controller_address, self.prefixlen), "dev", VETH_CTL])
        _run(["ip", "link", "set", VETH_CTL, "up"])

    def _start_acng(self) -> None:
        conf = self.config.state / "acng" / "conf"
        shutil.rmtree(conf, ignore_errors=True)
        shutil.copytree("/etc/apt-cacher-ng", conf)
        (conf / "backends_debian").write_text(self.config.mirror.rstrip("/") + "/\n")
        cache = self.config.cache / "acng"
        cache.mkdir(parents=True, exist_ok=True)
        (self.logs / "acng").mkdir(parents=True, exist_ok=True)
        self._spawn("apt-cacher-ng", [
            "/usr/sbin/apt-cacher-ng", "-c", str(conf), "ForeGround=1",
            "BindAddress=%s" % self.controller_address, "Port=%d" % self.config.acng_port,
            "CacheDir=%s" % cache, "LogDir=%s" % (self.logs / "acng"),
            "SocketPath=%s" % (self.config.state / "acng" / "socket"),
            "PidFile=%s" % (self.config.state / "acng" / "pid"),
        ])
        self._wait_port(self.controller_address, self.config.acng_port, 20, "apt-cacher-ng")

    def _wait_port(self, host: str, port: int, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=2):
                return
            time.sleep(0.2)
        raise LabError("%s did not listen on %s:%d within %ss (logs: %s)" % (what, host, port, timeout, self.logs))

    def _tarball(self, kind: str) -> Path:
        packages = PVE_PACKAGES if kind == "pve" else CT_PACKAGES
        key = hashlib.sha256(json.dumps([ROOTFS_FORMAT, self.config.suite, self.config.mirror, packages])
                             .encode()).hexdigest()[:12]
        return self.config.cache / "rootfs" / ("%s-%s-%s.tar" % (kind, self.config.suite, key))

    def _ensure_rootfs(self) -> dict:
        tarballs = {kind: self._tarball(kind) for kind in ("pve", "ct")}
        missing = {kind: path for kind, path in tarballs.items() if not path.exists()}
        if missing:
            self._say("building root filesystems %s with debootstrap (cached under %s afterwards)"
                      % (", ".join(sorted(missing)), self.config.cache / "rootfs"))
            self._parallel({kind: (lambda k=kind, p=path: self._build_rootfs(k, p)) for kind, path in missing.items()})
        return tarballs

    def _build_rootfs(self, kind: str, tarball: Path) -> None:
        packages = PVE_PACKAGES if kind == "pve" else CT_PACKAGES
        build = self.config.root / "build" / kind
        shutil.rmtree(build, ignore_errors=True)
        build.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, http_proxy=self.apt_proxy, DEBIAN_FRONTEND="noninteractive")
        self._run_in_cgroup("debootstrap-%s" % kind,
                            ["debootstrap", "--variant=minbase", "--include=" + ",".join(packages),
                             self.config.suite, str(build), self.config.mirror], timeout=900, env=env)
        for deb in (build / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        tarball.parent.mkdir(parents=True, exist_ok=True)
        tmp = tarball.with_suffix(".tar.tmp")
        _run(["tar", "--numeric-owner", "-C", str(build), "-cf", str(tmp), "."], timeout=600)
        os.replace(tmp, tarball)
        shutil.rmtree(build, ignore_errors=True)
        for old in tarball.parent.glob("%s-%s-*.tar" % (kind, self.config.suite)):
            if old != tarball:
                old.unlink()  # an older build format: not needed any more

    def _unpack(self, tarball: Path, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        _run(["tar", "--numeric-owner", "-xpf", str(tarball), "-C", str(dest)], timeout=600)

    def _parallel(self, jobs: dict) -> None:
        errors = {}

        def work(name, job):
            try:
                job()
            except BaseException as err:  # reported below, in the calling thread
                errors[name] = err

        threads = [threading.Thread(target=work, args=item, daemon=True) for item in jobs.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            name, err = next(iter(errors.items()))
            raise LabError("%s: %s" % (name, err)) from err

    def _write(self, path: Path, text: str, mode: int = 0o644) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".lab-tmp")
        tmp.write_text(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)

    def _install_guest_file(self, name: str, path: Path, mode: int = 0o755) -> None:
        self._write(path, (GUEST_FILES / name).read_text(), mode)

    def _apt_proxy_conf(self) -> str:
        return ('Acquire::http::Proxy "%s";\n'
                '// Repositories the lab serves itself (Lab.serve_directory) are reached directly.\n'
                'Acquire::http::Proxy::%s "DIRECT";\n' % (self.apt_proxy, self.controller_address))

    def _hosts_file(self, name: str) -> str:
        return ("127.0.0.1\tlocalhost\n127.0.1.1\t%s\n%s\t%s\n%s\tservelab-controller\n"
                % (name, self.pve_address, self.config.pve_hostname, self.controller_address))

    def _configure_pve(self) -> None:
        root = self.pve_rootfs
        self.ssh_key.parent.mkdir(parents=True, exist_ok=True)
        if not self.ssh_key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "servelab-lab", "-f", str(self.ssh_key)])
        self._write(root / "etc/hostname", self.config.pve_hostname + "\n")
        self._write(root / "etc/hosts", self._hosts_file(self.config.pve_hostname))
        self._write(root / "root/.ssh/authorized_keys", self.ssh_key.with_suffix(".pub").read_text(), 0o600)
        os.chmod(root / "root/.ssh", 0o700)
        self._write(root / "etc/ssh/sshd_config.d/servelab-lab.conf",
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n")
        self._write(root / "etc/apt/apt.conf.d/01servelab-lab-proxy", self._apt_proxy_conf())
        self._install_guest_file("pct", root / "usr/sbin/pct")
        self._install_guest_file("nvidia-smi", root / "usr/bin/nvidia-smi")
        self._install_guest_file("nvidia-modprobe", root / "usr/bin/nvidia-modprobe")
        self._install_guest_file("lab-cgroupfix", root / "usr/local/sbin/lab-cgroupfix")
        self._install_guest_file("lab-cgroupfix.service", root / "etc/systemd/system/lab-cgroupfix.service", 0o644)
        wants = root / "etc/systemd/system/sysinit.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            (wants / "lab-cgroupfix.service").symlink_to("../lab-cgroupfix.service")
        # The host's own LXC autostart and bridge are not part of the picture (and lxc.service
        # alone costs ~30 s of boot): containers are started by pct.
        for unit in ("lxc.service", "lxc-net.service", "lxc-monitord.service"):
            link = root / "etc/systemd/system" / unit
            if not link.is_symlink():
                link.symlink_to("/dev/null")
        (root / "var/log/servelab-lab").mkdir(parents=True, exist_ok=True)
        self._write(self.lxcpath / NAME / "config", "\n".join([
            "# servelab lab: the 'Proxmox host' (privileged system container, nesting for LXC inside)",
            "lxc.include = /usr/share/lxc/config/common.conf",
            "lxc.arch = linux64",
            "lxc.uts.name = %s" % self.config.pve_hostname,
            "lxc.rootfs.path = dir:%s" % self.pve_rootfs,
            "lxc.net.0.type = phys",
            "lxc.net.0.link = %s" % VETH_PVE,
            "lxc.net.0.ipv4.address = %s/%d" % (self.pve_address, self.prefixlen),
            "lxc.net.0.flags = up",
            "lxc.net.0.name = eth0",
            "lxc.include = /usr/share/lxc/config/nesting.conf",
            "lxc.mount.auto = cgroup:rw proc:rw sys:rw",
            "lxc.apparmor.profile = unconfined",
            "lxc.tty.max = 0",
            "lxc.log.file = %s" % (self.logs / "lxc-servelab-pve.log"),
            "lxc.log.level = INFO",
        ]) + "\n")

    def _configure_ct(self, vmid: int | None = None) -> None:
        vmid = vmid or self.config.vmid
        root = self.container_rootfs(vmid)
        name = "ct%d" % vmid
        self._write(root / "etc/hostname", name + "\n")
        self._write(root / "etc/hosts", self._hosts_file(name))
        self._write(root / "etc/apt/apt.conf.d/01servelab-lab-proxy", self._apt_proxy_conf())
        # The container's user-space driver stand-in (the real one would come from the
        # NVIDIA .run with --no-kernel-module, at exactly the host's version).
        self._install_guest_file("nvidia-smi", root / "usr/bin/nvidia-smi")
        self.reset_pve_config(vmid=vmid)
        # What PVE derives from rootfs:/ostype:/net0: on a real host; the lab's pct appends the
        # PVE config's lxc.* and devN lines to it on every start.
        self._write(self.pve_path("/var/lib/lxc/%d/config.lab-base" % vmid), (
            "# servelab lab: base LXC config of container %d (pct adds /etc/pve/lxc/%d.conf)\n"
            "lxc.include = /usr/share/lxc/config/debian.common.conf\n"
            "lxc.rootfs.path = dir:/var/lib/lxc/%d/rootfs\n"
            "lxc.apparmor.profile = unconfined\n"
            "lxc.tty.max = 0\n"
            "# No bridge in the lab: the container shares the Proxmox host's network (apt proxy, lab HTTP).\n"
            "lxc.net.0.type = none\n" % (vmid, vmid, vmid)))

    def add_container(self, vmid: int) -> float:
        """A second (third, ...) nested container like 129, from the same cached root filesystem,
        started and booted. Not in lab.inventory_path (the other tests keep their one container):
        write an inventory holding it with fleet_inventory(). Returns the seconds it took."""
        started = time.monotonic()
        if vmid == self.config.vmid or vmid in self._extra_vmids:
            raise LabError("container %d exists already" % vmid)
        self._extra_vmids.add(vmid)   # first: a failure below still tears it down
        self._unpack(self._tarball("ct"), self.container_rootfs(vmid))
        self._configure_ct(vmid)
        self._write(self.ct_path(FAKE_NVIDIA_JSON, vmid), self.ct_path(FAKE_NVIDIA_JSON).read_text())
        self.pct("start", str(vmid))
        self._wait_systemd(lambda argv: self.pct_exec(vmid, *argv, check=False, timeout=20), "container %d" % vmid)
        seconds = time.monotonic() - started
        self._say("container %d up in %.1f s" % (vmid, seconds))
        return seconds

    def remove_container(self, vmid: int) -> None:
        """Stop and delete a container add_container() made (129 stays)."""
        if vmid not in self._extra_vmids:
            raise LabError("container %d was not added by add_container()" % vmid)
        self.pct("stop", str(vmid), check=False, timeout=40)
        for path in (self.pve_path("/var/lib/lxc/%d" % vmid), self.pve_config_path(vmid)):
            if path.is_dir():
                self._remove_tree(path)
            elif path.exists():
                path.unlink()
        self._extra_vmids.discard(vmid)

    def _start_pve(self) -> None:
        self._say("starting the Proxmox host container")
        self._run_in_cgroup("lxc-start", ["lxc-start", "-P", str(self.lxcpath), "-n", NAME], timeout=60)
        self._wait_systemd(lambda argv: self.pve_exec(*argv, check=False, timeout=20), "Proxmox host")
        self._wait_port(self.pve_address, 22, 30, "sshd of the Proxmox host")

    def _wait_systemd(self, run, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            state = run(["systemctl", "is-system-running"]).stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.3)
        raise LabError("%s: systemd did not finish booting within %ss (state %r)" % (what, timeout, state))

    def _write_inventory(self) -> None:
        self._write_inventory_dir(self.inventory_path, [self.config.vmid])

    def fleet_inventory(self, dest, vmids, *, host_vars: dict | None = None, group_vars: dict | None = None,
                        extra_gpu_servers: dict | None = None) -> Path:
        """An inventory like lab.inventory_path whose gpu_servers are the containers `vmids`, in that
        order (add_container() the others first), and `extra_gpu_servers` ({name: host variables})
        after them. host_vars: {inventory name: variables} on top; group_vars: gpu_servers' vars
        (inventory variables: extra vars would override every host's)."""
        dest = Path(dest)
        self._write_inventory_dir(dest, list(vmids), host_vars=host_vars or {}, group_vars=group_vars or {},
                                  extra_gpu_servers=extra_gpu_servers or {})
        return dest

    def _write_inventory_dir(self, inv: Path, vmids: list, *, host_vars: dict | None = None,
                             group_vars: dict | None = None, extra_gpu_servers: dict | None = None) -> None:
        inv.mkdir(parents=True, exist_ok=True)
        for sub in ("group_vars", "host_vars"):
            link = inv / sub
            if link.is_symlink() or link.exists():
                if link.is_symlink() or link.is_file():
                    link.unlink()
                else:
                    shutil.rmtree(link)
            if (STATIC_INVENTORY / sub).is_dir():
                link.symlink_to(STATIC_INVENTORY / sub)
        pve = self.config.pve_hostname
        gpu_servers = {"ct%d" % vmid: {
            "ansible_connection": "community.proxmox.proxmox_pct_remote",
            "ansible_host": self.pve_address,
            "proxmox_vmid": vmid,
            "proxmox_host": pve,
        } for vmid in vmids}
        gpu_servers.update(extra_gpu_servers or {})
        for name, variables in (host_vars or {}).items():
            gpu_servers.setdefault(name, {}).update(variables)
        ssh_args = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
        hosts = {
            "all": {
                "vars": {
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(self.ssh_key),
                    "ansible_ssh_common_args": ssh_args,
                    "ansible_host_key_checking": False,
                },
                "children": {
                    "proxmox_hosts": {"hosts": {pve: {
                        "ansible_host": self.pve_address,
                        # No NVIDIA kernel driver in the lab: the role reads the lab's stand-ins.
                        "proxmox_gpu_passthrough_driver_version_file": FAKE_PROC + "/driver/nvidia/version",
                        "proxmox_gpu_passthrough_proc_devices": FAKE_PROC + "/devices",
                    }}},
                    "gpu_servers": dict({"hosts": gpu_servers}, **({"vars": group_vars} if group_vars else {})),
                    "bench_clients": {"hosts": {"localhost": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                    }}},
                },
            },
        }
        header = ("# Generated by tests/lab/labctl.py for the running lab (same groups and variables as\n"
                  "# inventory/sample; group_vars come from inventory/lab). Rewritten on every Lab.up().\n")
        self._write(inv / "hosts.yml", header + json.dumps(hosts, indent=2) + "\n")

    # ----- teardown --------------------------------------------------------------------------
    def _container_running(self) -> bool:
        if not (self.lxcpath / NAME / "config").exists() or shutil.which("lxc-info") is None:
            return False
        result = _run(["lxc-info", "-P", str(self.lxcpath), "-n", NAME, "-sH"], check=False, timeout=20)
        return result.returncode == 0 and result.stdout.strip() not in ("", "STOPPED")

    def _teardown(self) -> None:
        """Stop and remove everything the lab (this run or an interrupted earlier one) created."""
        started = time.monotonic()
        for proc in self._servers.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        if self._container_running():
            # Stop container 129 cleanly first, then the host (SIGKILL of its init would take
            # the nested container down too, but leave its cgroups for LXC to trip over).
            # Every nested container, also those an interrupted run added (add_container).
            listed = self.pve_exec("pct", "list", check=False, timeout=40).stdout.splitlines()[1:]
            vmids = {str(self.config.vmid)} | {line.split()[0] for line in listed if line.split()}
            for vmid in sorted(vmids):
                self.pve_exec("pct", "stop", vmid, check=False, timeout=40)
            _run(["lxc-stop", "-P", str(self.lxcpath), "-n", NAME, "-k"], check=False, timeout=60)
        cg = self._cgroup_path()
        if cg is not None and cg.exists():
            self._kill_cgroup(cg)
        for proc in list(self._procs.values()) + list(self._servers.values()):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()
        self._procs.clear()
        self._servers.clear()
        self._extra_vmids.clear()
        for hierarchy in Path("/sys/fs/cgroup").glob("*"):
            for path in sorted(hierarchy.rglob("lxc.*.%s" % NAME), key=lambda p: len(p.parts), reverse=True):
                self._remove_cgroup_tree(path)
        for link in (VETH_CTL, VETH_PVE):
            if Path("/sys/class/net", link).exists():
                _run(["ip", "link", "del", link], check=False)
        for directory in (self.lxcpath / NAME, self.config.root / "build"):
            if directory.exists():
                self._remove_tree(directory)
        if time.monotonic() - started > 1:
            self._say("teardown took %.1f s" % (time.monotonic() - started))

    def _kill_cgroup(self, cg: Path) -> None:
        kill_file = cg / "cgroup.kill"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for child in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                self._kill_cgroup(child)
            pids = (cg / "cgroup.procs").read_text().split()
            if not pids:
                break
            if kill_file.exists():
                kill_file.write_text("1")
            else:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.2)
        with contextlib.suppress(OSError):
            cg.rmdir()

    def _remove_cgroup_tree(self, path: Path) -> None:
        for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            path.rmdir()

    def _remove_tree(self, directory: Path) -> None:
        # Never recurse through a mount point: unmount anything still mounted below first.
        prefix = str(directory.resolve()) + "/"
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if (m + "/").startswith(prefix)), key=len, reverse=True):
            _run(["umount", "-l", mount], check=False)
        _run(["rm", "-rf", "--one-file-system", str(directory)], timeout=300)


def check_prerequisites(*, install: bool = True, log=print) -> None:
    """Root, and the host commands (installed with apt-get when missing and install=True)."""
    if os.geteuid() != 0:
        raise LabUnavailable("the lab needs root (LXC containers, veth links, debootstrap): run as root")
    missing = sorted({pkg for cmd, pkg in HOST_COMMANDS.items() if shutil.which(cmd) is None})
    if missing and install:
        if shutil.which("apt-get") is None:
            raise LabUnavailable("missing %s and no apt-get to install them" % ", ".join(missing))
        log("[lab] installing %s" % " ".join(missing))
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _run(["apt-get", "update", "-qq"], timeout=600, env=env)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing, timeout=900, env=env)
        missing = sorted({pkg for cmd, pkg in HOST_COMMANDS.items() if shutil.which(cmd) is None})
    if missing:
        raise LabUnavailable("missing host packages: %s (apt-get install %s)" % (", ".join(missing), " ".join(missing)))


@contextlib.contextmanager
def signals_as_interrupt():
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so `finally` teardown runs (the shell's trap)."""
    def handler(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="bring the lab up and leave it running (a later up/down replaces it)")
    sub.add_parser("down", help="tear down a lab left running, or the leftovers of an interrupted run")
    sub.add_parser("status", help="list what of a lab exists on this machine")
    sub.add_parser("build", help="only build the cached root filesystems")
    run = sub.add_parser("run", help="bring the lab up, run a command (LAB_INVENTORY set), tear it down")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if args.command == "status":
        found = Lab().leftovers()
        print("\n".join(found) if found else "no lab on this machine")
        return 0
    if args.command == "down":
        check_prerequisites(install=False)
        lab = Lab()
        lab._acquire_lock(60)
        lab.down()
        found = lab.leftovers()
        print("\n".join(found) if found else "lab torn down")
        return 1 if found else 0
    with signals_as_interrupt():
        if args.command == "build":
            check_prerequisites()
            lab = Lab()
            lab._acquire_lock(60)
            try:
                lab._teardown()
                lab._ensure_cgroup()
                lab._network_up()
                lab._start_acng()
                lab._ensure_rootfs()
            finally:
                lab.down()
            return 0
        lab = Lab.up()
        if args.command == "up":
            # apt-cacher-ng and the containers keep running after we exit; `down` ends them.
            print("inventory: %s\nssh: ssh -i %s root@%s" % (lab.inventory_path, lab.ssh_key, lab.pve_address))
            return 0
        try:
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            env = dict(lab.ansible_env(), LAB_INVENTORY=str(lab.inventory_path))
            return subprocess.run(cmd, env=env, check=False).returncode if cmd else 0
        finally:
            lab.down()


if __name__ == "__main__":
    sys.exit(main())
