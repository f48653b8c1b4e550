"""Repository-wide pytest setup.

Modules import their logic as `ansible.module_utils.servelab.*` (that is how Ansible ships it to
the target). For tests we make the same import path resolve to plugins/module_utils/servelab by
extending the `ansible.module_utils` package path, so tests exercise the very files Ansible ships.
"""
import os
import sys

REPO = os.path.dirname(os.path.abspath(__file__))
_MU = os.path.join(REPO, "plugins", "module_utils")
try:
    import ansible.module_utils
    if _MU not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(_MU)
except ImportError:
    # The GPU machine has pytest but no Ansible: tests/gpu only needs module_utils, which
    # gpu_env provides under the same import path through a stand-in package.
    sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
    import gpu_env
    gpu_env.use_module_utils()
# tests/ for the helpers tests share (simproc: the simulator as a child process).
for sub in ("plugins/modules", "plugins/action", "plugins/callback", "tests"):
    p = os.path.join(REPO, sub)
    if p not in sys.path:
        sys.path.insert(0, p)
os.environ.setdefault("ANSIBLE_CONFIG", os.path.join(REPO, "ansible.cfg"))
