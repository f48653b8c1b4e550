"""servelab's simulator behind an SGLang-style `--api-key KEY` flag (tests only).

The simulator rejects flags it does not know, as it should; a real engine takes `--api-key`.
This stands in for such an engine in the secrets canary test: it drops `--api-key KEY` (the key
is not checked) and runs the simulator (the checkout's package, made importable by
tools/collection_link) with the rest of its arguments. Run it with the `command` engine.
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402

collection_link.importable()
from ansible_collections.servelab.serving.plugins.module_utils.simulator.cli import main  # noqa: E402

args = sys.argv[1:]
while "--api-key" in args:
    at = args.index("--api-key")
    del args[at:at + 2]
raise SystemExit(main(args))
