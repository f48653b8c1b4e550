"""The lab itself: the pct stand-in applies the PVE config like PVE, apt goes through the lab-only
cache, directories served on the lab link reach container 129, pct covers what Ansible uses."""
from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.lab


@pytest.fixture
def ct(lab):
    """Container 129 back to its pristine config and running when the test ends."""
    yield lab
    lab.reset_pve_config()
    if "running" in lab.pct("status", str(lab.config.vmid)).stdout:
        lab.pct("reboot", str(lab.config.vmid))
    else:
        lab.pct("start", str(lab.config.vmid))


def test_pct_start_applies_lxc_and_dev_lines_of_the_main_section(ct):
    lab = ct
    vmid = str(lab.config.vmid)
    lab.pve_exec("sh", "-c", "rm -f /dev/lab-probe && mknod -m 666 /dev/lab-probe c 1 3 && mkdir -p /srv/lab-share "
                 "&& echo shared > /srv/lab-share/hello")
    lab.reset_pve_config(lab.pristine_pve_config()
                         + "dev0: /dev/lab-probe,mode=0666\n"
                         + "lxc.environment: SERVELAB_LAB_PROBE=applied\n"
                         + "lxc.mount.entry: /srv/lab-share srv/lab-share none bind,create=dir 0 0\n"
                         + "\n[snap1]\nlxc.environment: SERVELAB_LAB_SNAPSHOT=leaked\n")
    lab.pct("reboot", vmid)

    environ = lab.pct_exec(vmid, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ").stdout.split()
    assert "SERVELAB_LAB_PROBE=applied" in environ
    assert not any(item.startswith("SERVELAB_LAB_SNAPSHOT") for item in environ), "a snapshot section was applied"
    assert lab.pct_exec(vmid, "stat", "-c", "%F %t:%T", "/dev/lab-probe").stdout.strip() == "character special file 1:3"
    assert lab.pct_exec(vmid, "cat", "/srv/lab-share/hello").stdout == "shared\n"
    generated = lab.pve_path("/var/lib/lxc/%s/config" % vmid).read_text()
    assert "lxc.cgroup2.devices.allow = c 1:3 rwm" in generated


def test_pct_covers_status_list_push_pull(lab, tmp_path):
    vmid = str(lab.config.vmid)
    assert lab.pct("status", vmid).stdout.strip() == "status: running"
    assert any(line.split()[:2] == [vmid, "running"] for line in lab.pct("list").stdout.splitlines()[1:])
    missing = lab.pct("status", "999", check=False)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    lab.pve_exec("sh", "-c", "printf 'pushed\\n' > /tmp/lab-push")
    lab.pct("push", vmid, "/tmp/lab-push", "/root/pushed", "--perms", "0600")
    assert lab.pct_exec(vmid, "stat", "-c", "%a %s", "/root/pushed").stdout.strip() == "600 7"
    lab.pct("pull", vmid, "/etc/hostname", "/tmp/lab-pull")
    assert lab.pve_path("/tmp/lab-pull").read_text() == "ct%s\n" % vmid


def test_apt_goes_through_the_lab_only_cache(lab):
    result = lab.pct_exec(lab.config.vmid, "apt-get", "-q", "update", timeout=300)
    assert result.returncode == 0
    assert "deb.debian.org" in result.stdout
    # The cache listens on the lab link only, not on this machine's other addresses.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", lab.config.acng_port), timeout=3).close()
    socket.create_connection((lab.controller_address, lab.config.acng_port), timeout=3).close()


def test_served_directory_is_reachable_from_the_container(lab, tmp_path):
    (tmp_path / "dists").mkdir()
    (tmp_path / "dists" / "Release").write_text("Origin: servelab-lab\n")
    url = lab.serve_directory(tmp_path)
    fetch = "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode(), end='')"
    out = lab.pct_exec(lab.config.vmid, "python3", "-c", fetch, url + "dists/Release").stdout
    assert out == "Origin: servelab-lab\n"
