"""A stand-in SGLang install for tests of the flag check: an interpreter whose `sglang` is a
dist-info with a version and a server_args.py that defines the given flags.

server/argdefs.py parses that source and never imports it, and server/engine.py asks the
interpreter for the version through importlib.metadata, so the stand-in goes through the very
code a real install does (tests/unit/test_server_sglang_argdefs.py holds the parser to the real
wheels).
"""
from __future__ import annotations

import stat
import sys

# The flags servelab renders for a baseline profile with tp and metrics.
BASELINE_FLAGS = ("--model-path", "--host", "--port", "--tp-size", "--enable-metrics")


def fake_sglang(directory, version: str = "0.5.23", flags=BASELINE_FLAGS) -> str:
    """The path of an executable `python` whose sglang is the stand-in, under `directory`."""
    site = directory / "site"
    srt = site / "sglang" / "srt"
    srt.mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (srt / "__init__.py").write_text("")
    (srt / "server_args.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\n"
        + "".join("parser.add_argument(%r, help='x')\n" % f for f in flags))
    info = site / ("sglang-%s.dist-info" % version)
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: %s\n" % version)
    python = directory / "python"
    python.write_text('#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' % (site, sys.executable))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return str(python)
