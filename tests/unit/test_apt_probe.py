"""The apt repository probe (plugins/module_utils/apt/probe.py): versions read with every apt file in a
temporary directory, and apt's reason (not debconf's chatter) when it fails."""
from __future__ import annotations

import os

from ansible_collections.servelab.serving.plugins.module_utils.apt import probe as p

MADISON = """cuda-toolkit-13-0 |   13.0.1-1 | http://10.77.129.1:4001  Packages
cuda-toolkit-13-0 |   13.0.0-1 | http://10.77.129.1:4001  Packages
"""


def test_madison_lines_give_the_versions_newest_first():
    assert p.madison_versions(MADISON, "cuda-toolkit-13-0") == ["13.0.1-1", "13.0.0-1"]
    assert p.madison_versions(MADISON, "cuda-toolkit-12-8") == []


def test_apt_reason_leads_with_the_error_not_debconf():
    stderr = ("debconf: delaying package configuration, since apt-utils is not installed\n"
              "dpkg: error processing archive /var/cache/apt/archives/x.deb (--unpack):\n"
              " cannot copy extracted data for './usr/local/cuda-13.0/bin/nvcc': failed to write (No space left on device)\n"
              "E: Sub-process /usr/bin/dpkg returned an error code (1)\n")
    reason = p.apt_reason(stderr)
    assert reason.startswith("cannot copy extracted data for './usr/local/cuda-13.0/bin/nvcc': failed to write "
                             "(No space left on device); E: Sub-process /usr/bin/dpkg returned an error code (1)")
    assert "debconf" not in reason
    assert p.apt_reason("W: Some index files failed to download\n") == "W: Some index files failed to download"
    assert p.apt_reason("debconf: nothing\n") == ""


def test_the_probe_keeps_every_apt_file_in_its_own_directory(tmp_path):
    key = tmp_path / "k.pub"
    key.write_bytes(b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n...")
    seen = []

    def run(argv):
        seen.append(list(argv))
        root = [a for a in argv if a.startswith("Dir::Etc::SourceList=")][0].split("=", 1)[1].rsplit("/", 1)[0]
        if argv[0] == "apt-get":
            with open(os.path.join(root, "sources.list")) as handle:
                seen.append(handle.read())
            assert os.path.isfile(os.path.join(root, "key.asc"))
            return 0, "Hit:1 http://x /\n", ""
        return 0, MADISON, ""

    found = p.probe("http://x/", str(key), "cuda-toolkit-13-0", run=run)
    assert found.versions == ["13.0.1-1", "13.0.0-1"] and found.error == ""
    assert seen[1].startswith("deb [signed-by=") and seen[1].endswith("/key.asc] http://x/ /\n")
    for argv in (seen[0], seen[2]):
        assert "APT::Sandbox::User=root" in argv
        assert all(not o.split("=", 1)[1].startswith(("/etc", "/var")) for o in argv if o.startswith("Dir::"))
    root = seen[1].split("signed-by=")[1].rsplit("/", 1)[0]
    assert not os.path.exists(root), "the temporary directory must be removed"


def test_an_unreadable_repository_gives_apt_reason():
    def run(argv):
        if argv[0] == "apt-get":
            return 0, "Err:1 http://x  InRelease\n  404  Not Found\n", "E: The repository 'http://x  Release' does not have a Release file.\n"
        raise AssertionError("madison must not run")

    found = p.probe("http://x/", None, "cuda-toolkit-13-0", run=run)
    assert found.versions == [] and found.error.startswith("E: The repository 'http://x  Release' does not have")
    assert found.error.endswith("; Err:1 http://x  InRelease (404 Not Found)"), found.error


def test_an_unreadable_key_is_said(tmp_path):
    found = p.probe("http://x/", str(tmp_path / "missing.pub"), "cuda-toolkit-13-0", run=lambda argv: (0, "", ""))
    assert found.versions == [] and "the repository key %s could not be read" % (tmp_path / "missing.pub") in found.error
