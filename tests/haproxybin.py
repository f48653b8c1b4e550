"""The distribution's HAProxy for the router tests: found, or installed as root when missing
(Debian's `haproxy` package, like the browser test's chromium), skipped otherwise, failed under
CI."""
import os
import shutil
import subprocess
from contextlib import contextmanager

import pytest

POLICY_RC_D = "/usr/sbin/policy-rc.d"


@contextmanager
def _services_not_started():
    """Debian's policy-rc.d protocol: exit 101 tells the package's maintainer scripts not to
    start its service (a test starts its own haproxy processes, by PID). Written only where the
    machine has none, and removed again afterwards."""
    if os.path.lexists(POLICY_RC_D):
        yield
        return
    with open(POLICY_RC_D, "w", encoding="utf-8") as fh:
        fh.write("#!/bin/sh\nexit 101\n")
    os.chmod(POLICY_RC_D, 0o755)
    try:
        yield
    finally:
        os.unlink(POLICY_RC_D)


def haproxy_binary() -> str:
    """The distribution's haproxy, installed as root when missing (like the browser test's
    chromium). The package's service is not started: a policy-rc.d for the install only."""
    found = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", RUNLEVEL="1")
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=600)
        with _services_not_started():
            subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                            "haproxy"], env=env, check=False, timeout=900)
        found = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy")
                                            and "/usr/sbin/haproxy")
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("haproxy missing under CI (apt-get install haproxy)", pytrace=False)
    pytest.skip("no haproxy (apt-get install haproxy, as root)")
