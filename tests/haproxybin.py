"""The distribution's HAProxy for the router tests: found, or installed as root when missing
(Debian's `haproxy` package, like the browser test's chromium), skipped otherwise, failed under
CI."""
import os
import shutil
import subprocess

import pytest


def haproxy_binary() -> str:
    """The distribution's haproxy, installed as root when missing (like the browser test's
    chromium). The package's service is not started: a policy-rc.d for the install only."""
    found = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", RUNLEVEL="1")
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "haproxy"],
                       env=env, check=False, timeout=900)
        found = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy")
                                            and "/usr/sbin/haproxy")
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("haproxy missing under CI (apt-get install haproxy)", pytrace=False)
    pytest.skip("no haproxy (apt-get install haproxy, as root)")
