"""servelab's simulator behind an SGLang-style `--api-key KEY` flag (tests only).

The simulator rejects flags it does not know, as it should; a real engine takes `--api-key`.
This stands in for such an engine in the secrets canary test: it drops `--api-key KEY` (the key
is not checked) and runs the simulator, one self-contained stdlib file, with the rest of its
arguments. Run it with the `command` engine.
"""
import os
import runpy
import sys

SIMULATOR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "plugins", "module_utils", "simulator.py")

args = sys.argv[1:]
while "--api-key" in args:
    at = args.index("--api-key")
    del args[at:at + 2]
sys.argv = [SIMULATOR] + args
runpy.run_path(SIMULATOR, run_name="__main__")
