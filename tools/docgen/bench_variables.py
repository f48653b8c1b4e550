"""The README's bench variables table, generated from the one definition of the bench options
(roles/bench/meta/argument_specs.yml, read by plugin_utils/preflight/options.py).

    python tools/docgen/bench_variables.py            # rewrite README.md's section
    python tools/docgen/bench_variables.py --check    # exit 1 when README.md's section is stale

The section sits between `<!-- bench-variables:begin -->` and `<!-- bench-variables:end -->`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "collections"))   # the checkout as servelab.serving
sys.path.insert(0, os.path.join(REPO, "tools"))

from docgen.markers import replace_section  # noqa: E402

import yaml  # noqa: E402

from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.options import (  # noqa: E402
    COLLECTION_ROOT, ROLE_DEFAULTS_FILE, ROLE_SPEC_FILE, VariableSpec, bench_spec,
)

NAME = "bench-variables"
README = os.path.join(REPO, "README.md")
# Ansible's documentation markup: I(option), C(code), O(option), V(value), B(bold), U(url).
_MARKUP = re.compile(r"\b([ICOVBU])\(((?:[^()]|\([^()]*\))*)\)")


def _markdown(text: str) -> str:
    text = _MARKUP.sub(lambda m: "`%s`" % m.group(2) if m.group(1) != "B" else "**%s**"
                       % m.group(2), text)
    # Outside code spans, <run_id> would be read as an HTML tag.
    parts = " ".join(text.split()).split("`")
    parts = [p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;")
             for i, p in enumerate(parts)]
    return "`".join(parts).replace("|", "\\|")


def _default(opt: VariableSpec, role_defaults: dict) -> str:
    if opt.required:
        return "(required)"
    if not opt.has_default or opt.default is None:
        # A default the role computes (a template over the host's variables): shown as it is.
        computed = role_defaults.get(opt.name)
        return "`%s`" % computed if isinstance(computed, str) and "{{" in computed else "unset"
    value: Any = opt.default
    shown = value if isinstance(value, str) else json.dumps(value).replace('"', "")
    return "`%s`" % (shown if shown != "" else '""')


def _type(opt: VariableSpec) -> str:
    kind = "%s of %s" % (opt.type, opt.elements) if opt.elements else opt.type
    if opt.choices:
        kind += ": " + ", ".join("`%s`" % c for c in opt.choices)
    return kind


def table() -> str:
    rel = os.path.relpath(ROLE_SPEC_FILE, COLLECTION_ROOT)
    with open(ROLE_DEFAULTS_FILE, encoding="utf-8") as fh:
        role_defaults = yaml.safe_load(fh) or {}
    lines = ["<!-- generated from %s by tools/docgen/bench_variables.py (make docs): edit the spec,"
             " not this table -->" % rel, "",
             "| variable | type | default | meaning |", "|---|---|---|---|"]
    for name, opt in bench_spec().items():
        lines.append("| `%s` | %s | %s | %s |" % (
            name, _type(opt), _default(opt, role_defaults).replace("|", "\\|"), _markdown(" ".join(opt.description))))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the file is stale")
    parser.add_argument("--file", default=README)
    args = parser.parse_args(argv)
    with open(args.file, encoding="utf-8") as fh:
        text = fh.read()
    new = replace_section(text, NAME, table())
    if args.check:
        if new != text:
            print("%s: the bench variables table is stale; run `make docs`" % args.file,
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        with open(args.file, "w", encoding="utf-8") as fh:
            fh.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
