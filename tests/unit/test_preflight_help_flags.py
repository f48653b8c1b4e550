"""The command engine's flags checked against the command's own --help (module_utils/
preflight.py help_flags, check_help_flags): placeholders and the options they are values of are
left out of the command, every flag --help prints is known (ANSI colours and typer's boxes
stripped), a missing one is named with the nearest known flag, a command that prints none is a
problem of its own."""
from __future__ import annotations

import sys
import textwrap

from ansible_collections.servelab.serving.plugins.module_utils.preflight import (
    check_help_flags, help_flags,
)

SERVER = textwrap.dedent("""\
    import argparse, sys
    if "--port" in sys.argv and sys.argv[sys.argv.index("--port") + 1] == "--help":
        sys.exit("--port took --help as its value")
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--port", type=int)
    ap.add_argument("--cb-max-batch-tokens", type=int)
    ap.add_argument("--cb-use-cuda-graph", action="store_true")
    ap.parse_args()
    """)


def script(tmp_path, body=SERVER):
    path = tmp_path / "server.py"
    path.write_text(body)
    return [sys.executable, str(path)]


def test_the_commands_help_names_its_flags(tmp_path):
    argv = script(tmp_path) + ["{model}", "--port", "{port}"]
    found, error = help_flags(argv)
    assert error == "" and {"--port", "--cb-max-batch-tokens", "--cb-use-cuda-graph"} <= found


def test_a_flag_the_command_lacks_is_named_with_the_nearest(tmp_path):
    item = {"variable": "tune_space", "argv": script(tmp_path) + ["--port", "{port}"],
            "flags": ["--cb-max-batch-tokens", "--cb-max-batch-token"], "hosts": ["h"]}
    [problem] = check_help_flags(item)
    assert problem.message == ("tune_space: --cb-max-batch-token is not a flag of the command "
                               "(its --help lists no such option); did you mean "
                               "--cb-max-batch-tokens?")


def test_a_command_that_prints_no_flags_is_a_problem(tmp_path):
    item = {"variable": "tune_space", "argv": script(tmp_path, "print('hello')"),
            "flags": ["--x"], "hosts": ["h"]}
    [problem] = check_help_flags(item)
    assert "cannot check the flags against the command's own definitions" in problem.message
    assert "printed no flags" in problem.message
