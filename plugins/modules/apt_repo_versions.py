#!/usr/bin/python
# -*- coding: utf-8 -*-
# The logic is plugins/module_utils/apt/probe.py (unit-tested in tests/unit/test_apt_probe.py).
from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_repo_versions
short_description: The versions of a package in an apt repository, read without configuring that repository
description:
  - Runs C(apt-get update) and C(apt-cache madison) against O(url) alone, with apt's sources list, lists, cache and
    the key all in a temporary directory (removed afterwards). apt's own configuration (proxy, auth.conf) applies,
    so the repository is read as the real install will read it, with its signature checked against O(key).
  - Changes nothing on the host (no file under C(/etc/apt) or C(/var/lib/apt), no apt or dpkg lock taken), so it
    runs in check mode too. Role cuda_toolkit's preflight uses it to refuse a version the repository lacks before
    the host's apt source and key are rewritten.
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  url:
    description: The flat repository (C(deb <url> /)).
    type: str
    required: true
  key:
    description: The repository's signing key, a URL or an absolute path on the host; empty for apt's own keyrings.
    type: str
    default: ""
  package:
    description: The package whose versions are listed.
    type: str
    required: true
  version:
    description: The version wanted; RV(present) says whether the repository has it.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Check that the repository has the pinned toolkit
  servelab.serving.apt_repo_versions:
    url: https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/
    key: https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/3bf863cc.pub
    package: cuda-toolkit-13-0
    version: 13.0.1-1
  register: probe
"""

RETURN = r"""
versions:
  description: "The versions of O(package) the repository has, newest first (empty: none, or unreadable)."
  returned: always
  type: list
  elements: str
present:
  description: Whether O(version) is among RV(versions).
  returned: always
  type: bool
error:
  description: apt's reason when the repository could not be read (its E/Err lines, then W), else empty.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url
from ansible_collections.servelab.serving.plugins.module_utils.apt.probe import probe


def main():
    module = AnsibleModule(argument_spec=dict(
        url=dict(type="str", required=True),
        key=dict(type="str", default="", no_log=False),
        package=dict(type="str", required=True),
        version=dict(type="str", default=""),
    ), supports_check_mode=True)
    for tool in ("apt-get", "apt-cache"):
        if not module.get_bin_path(tool):
            module.fail_json(msg="%s is not installed on this host: apt_repo_versions needs apt" % tool)

    def read_key(url):
        response, info = fetch_url(module, url, method="GET")
        if response is None or info.get("status") not in (200, None):
            raise ValueError("HTTP %s %s" % (info.get("status"), info.get("msg", "")))
        return response.read()

    def run(argv):
        return module.run_command(list(argv), environ_update={"LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"})

    found = probe(module.params["url"], module.params["key"] or None, module.params["package"], run=run,
                  key_reader=read_key)
    version = module.params["version"]
    module.exit_json(changed=False, versions=found.versions, error=found.error,
                     present=bool(version) and version in found.versions)


if __name__ == "__main__":
    main()
