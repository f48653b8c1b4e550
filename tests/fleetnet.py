"""Three test hosts in network namespaces, reached by Ansible over SSH: two GPU servers and the
bench client they share (tests/integration/test_bench_fleet.py).

    controller (root netns) ──ssh── mgmt bridge 10.78.N.0/24 ──┬── gpu-a  .2 ─┐
                                                              ├── gpu-b  .3 ─┼── data bridge
                                                              └── client .4 ─┘   10.78.N+1.0/24
Each namespace runs its own sshd (the test's key, root login) on its management address. The
servers listen on the data network, which the controller has no address on and an unreachable
route to: only the client namespace reaches them, so the load the test measures really comes from
the client host.

The namespaces share this machine's file system, processes and kernel (as two GPU servers on one
machine would): each server host gets its own state directory and port (host_vars).

Every name starts with `sl-fleet-` plus a token of this process (netns, links, bridges), the
subnets are two free /24s of 10.78.0.0/16 (the lab uses 10.77.129.0/24), and `down()` removes
all of it, ending by pid only what runs inside these namespaces and the SSH masters on the
test's own control sockets. Root only: `FleetNet.available()` says why not.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime

PREFIX = "sl-fleet-"
SSHD = "/usr/sbin/sshd"
HOSTS = ("gpu-a", "gpu-b", "client")
SERVERS = ("gpu-a", "gpu-b")


class FleetNetUnavailable(RuntimeError):
    """A prerequisite is missing (not root, no sshd, no ip): the test skips, or fails under CI."""


def _run(argv, check=True, timeout=60, **kw):
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                            timeout=timeout, check=False, **kw)
    if check and result.returncode != 0:
        raise RuntimeError("command failed (rc %d): %s\n%s%s" % (
            result.returncode, " ".join(map(str, argv)), result.stdout, result.stderr))
    return result


def _kill_and_wait(pids, timeout=10.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(lifetime.is_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if lifetime.is_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def ensure_sshd() -> None:
    """Root, ip, nsenter and sshd; sshd installed with apt-get when missing (as the lab installs
    its host packages), with service starts denied so no system sshd comes up."""
    if os.geteuid() != 0:
        raise FleetNetUnavailable("the fleet test needs root (network namespaces, veth links, sshd)")
    for tool in ("ip", "nsenter", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise FleetNetUnavailable("%s is missing (apt-get install iproute2 util-linux "
                                      "openssh-client)" % tool)
    if os.path.exists(SSHD):
        return
    if shutil.which("apt-get") is None:
        raise FleetNetUnavailable("no %s and no apt-get to install openssh-server" % SSHD)
    policy = Path("/usr/sbin/policy-rc.d")
    ours = not policy.exists()
    if ours:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _run(["apt-get", "update", "-qq"], timeout=600, env=env)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server"],
             timeout=900, env=env)
    finally:
        if ours:
            policy.unlink()
    if not os.path.exists(SSHD):
        raise FleetNetUnavailable("openssh-server did not install %s" % SSHD)


def _free_subnets() -> tuple:
    """Two consecutive free third octets of 10.78.0.0/16 (no address of this machine in them)."""
    used = set(int(m) for m in re.findall(r"inet 10\.78\.(\d+)\.",
                                          _run(["ip", "-4", "-o", "addr"]).stdout))
    start = os.getpid() % 120 * 2 + 2
    for k in list(range(start, 250, 2)) + list(range(2, start, 2)):
        if k not in used and k + 1 not in used:
            return k, k + 1
    raise FleetNetUnavailable("no free /24 pair left in 10.78.0.0/16")


class FleetNet:
    def __init__(self, scratch: Path):
        self.scratch = Path(scratch)
        self.token = "%04x" % (os.getpid() & 0xFFFF)
        self.mgmt_octet, self.data_octet = _free_subnets()
        self.netns = {h: "%s%s-%s" % (PREFIX, self.token, h) for h in HOSTS}
        self.bridges = {"mgmt": "%s%sm" % (PREFIX, self.token),
                        "data": "%s%sd" % (PREFIX, self.token)}
        self.sshd = {}          # host -> Popen
        self.ssh_dir = self.scratch / "ssh"
        self.control_dir = self.scratch / "cp"
        self._made_run_sshd = False

    # Addresses -----------------------------------------------------------------------------

    def mgmt(self, host: str) -> str:
        return "10.78.%d.%d" % (self.mgmt_octet, HOSTS.index(host) + 2)

    def data(self, host: str) -> str:
        return "10.78.%d.%d" % (self.data_octet, HOSTS.index(host) + 2)

    @property
    def data_subnet(self) -> str:
        return "10.78.%d.0/24" % self.data_octet

    @property
    def controller_address(self) -> str:
        return "10.78.%d.1" % self.mgmt_octet

    def _veth(self, host: str, net: str) -> str:
        return "%s%s%d" % (PREFIX, self.token, HOSTS.index(host) * 2 + (net == "data"))

    # Up and down ---------------------------------------------------------------------------

    def up(self) -> FleetNet:
        self.down()                       # leftovers of a killed earlier run with this token
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.ssh_dir.mkdir(exist_ok=True)
        self.control_dir.mkdir(exist_ok=True)
        for bridge in self.bridges.values():
            _run(["ip", "link", "add", bridge, "type", "bridge"])
            _run(["ip", "link", "set", bridge, "up"])
        _run(["ip", "addr", "add", self.controller_address + "/24", "dev", self.bridges["mgmt"]])
        # The controller must not reach the data network, not even through its default route.
        _run(["ip", "route", "add", "unreachable", self.data_subnet])
        for host in HOSTS:
            ns = self.netns[host]
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            nets = ("mgmt", "data")
            for i, net in enumerate(nets):
                outside, inside = self._veth(host, net), "eth%d" % i
                _run(["ip", "link", "add", outside, "type", "veth", "peer", "name", inside,
                      "netns", ns])
                _run(["ip", "link", "set", outside, "master", self.bridges[net], "up"])
                address = self.mgmt(host) if net == "mgmt" else self.data(host)
                _run(["ip", "-n", ns, "addr", "add", address + "/24", "dev", inside])
                _run(["ip", "-n", ns, "link", "set", inside, "up"])
        self._keys()
        for host in HOSTS:
            self._start_sshd(host)
        for host in HOSTS:
            self._wait_ssh(host)
        return self

    def _keys(self) -> None:
        for name in ("id_ed25519", "host_ed25519"):
            if not (self.ssh_dir / name).exists():
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.ssh_dir / name])
        shutil.copy(self.ssh_dir / "id_ed25519.pub", self.ssh_dir / "authorized_keys")

    def _start_sshd(self, host: str) -> None:
        if not os.path.isdir("/run/sshd"):           # sshd's privilege-separation directory
            os.makedirs("/run/sshd", mode=0o755)
            self._made_run_sshd = True
        config = self.ssh_dir / ("sshd-%s.conf" % host)
        config.write_text("\n".join([
            "Port 22", "ListenAddress %s" % self.mgmt(host),
            "HostKey %s" % (self.ssh_dir / "host_ed25519"),
            "PermitRootLogin prohibit-password",
            "AuthorizedKeysFile %s" % (self.ssh_dir / "authorized_keys"),
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
            "StrictModes no", "PidFile none", "MaxSessions 50", "MaxStartups 50:30:100",
            "Subsystem sftp /usr/lib/openssh/sftp-server", ""]))
        log = open(self.scratch / ("sshd-%s.log" % host), "ab")  # noqa: SIM115 - the child's
        self.sshd[host] = subprocess.Popen(
            ["nsenter", "--net=/run/netns/%s" % self.netns[host], SSHD, "-D", "-e",
             "-f", str(config)], stdout=log, stderr=log, start_new_session=True)
        log.close()

    def _wait_ssh(self, host: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sshd[host].poll() is not None:
                raise RuntimeError("sshd of %s exited: %s" % (host, (
                    self.scratch / ("sshd-%s.log" % host)).read_text()[-2000:]))
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex((self.mgmt(host), 22)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError("sshd of %s did not listen on %s:22" % (host, self.mgmt(host)))

    def netns_pids(self, host: str) -> list:
        ns = self.netns[host]
        if not os.path.exists("/run/netns/%s" % ns):
            return []
        out = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        return [int(p) for p in out if p.isdigit() and lifetime.is_alive(int(p))]

    def down(self) -> None:
        """Remove everything up() made; idempotent, and safe after a half-made up()."""
        if self.control_dir.is_dir():
            for sock in self.control_dir.iterdir():
                _run(["ssh", "-o", "ControlPath=%s" % sock, "-O", "exit", "fleet"], check=False,
                     timeout=10)
        for proc in self.sshd.values():
            if proc.poll() is None:
                _kill_and_wait([proc.pid])
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.sshd.clear()
        # Whatever still runs in these namespaces is this test's (sshd sessions, a server the
        # test run left behind): ended by pid.
        for host in HOSTS:
            _kill_and_wait(self.netns_pids(host))
        for host in HOSTS:
            _run(["ip", "netns", "del", self.netns[host]], check=False)
        for bridge in self.bridges.values():
            _run(["ip", "link", "del", bridge], check=False)
        _run(["ip", "route", "del", "unreachable", self.data_subnet], check=False)
        if self._made_run_sshd:
            with contextlib.suppress(OSError):
                os.rmdir("/run/sshd")
            self._made_run_sshd = False

    def leftovers(self) -> list:
        left = []
        names = _run(["ip", "-o", "link"], check=False).stdout
        left += ["link %s" % n for n in re.findall(r"\d+: (%s%s[^:@ ]*)" % (PREFIX, self.token),
                                                   names)]
        spaces = _run(["ip", "netns", "list"], check=False).stdout
        left += ["netns %s" % n for n in self.netns.values() if n in spaces]
        routes = _run(["ip", "route", "show", self.data_subnet], check=False).stdout.strip()
        left += ["route %s" % routes] if routes else []
        return left

    # Ansible -------------------------------------------------------------------------------

    def ssh_env(self) -> dict:
        """Environment for ansible-playbook: the test's key, control sockets in its scratch
        directory (closed by down()), no host key checks (fresh keys each run)."""
        return {"ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control_dir),
                "ANSIBLE_HOST_KEY_CHECKING": "False"}

    def host_vars(self, host: str) -> dict:
        return {"ansible_host": self.mgmt(host), "ansible_user": "root",
                "ansible_ssh_private_key_file": str(self.ssh_dir / "id_ed25519"),
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no "
                                           "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                "ansible_python_interpreter": "/usr/bin/python3"}
