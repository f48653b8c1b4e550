"""docs/tune.md's variables table, generated from the one definition of the tune options
(roles/tune/meta/argument_specs.yml, read by plugin_utils/tune/settings.py).

    python tools/docgen/tune_variables.py            # rewrite docs/tune.md's section
    python tools/docgen/tune_variables.py --check    # exit 1 when it is stale

The section sits between `<!-- tune-variables:begin -->` and `<!-- tune-variables:end -->`; the
cells are written as tools/docgen/bench_variables.py writes the README's bench table.
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "collections"))   # the checkout as servelab.serving
sys.path.insert(0, os.path.join(REPO, "tools"))

from docgen.bench_variables import _default, _markdown, _type  # noqa: E402
from docgen.markers import replace_section  # noqa: E402

import yaml  # noqa: E402

from ansible_collections.servelab.serving.plugins.plugin_utils.tune.settings import (  # noqa: E402
    COLLECTION_ROOT, TUNE_DEFAULTS_FILE, TUNE_SPEC_FILE, tune_spec,
)

NAME = "tune-variables"
DOC = os.path.join(REPO, "docs", "tune.md")


def table() -> str:
    rel = os.path.relpath(TUNE_SPEC_FILE, COLLECTION_ROOT)
    with open(TUNE_DEFAULTS_FILE, encoding="utf-8") as fh:
        role_defaults = yaml.safe_load(fh) or {}
    lines = ["<!-- generated from %s by tools/docgen/tune_variables.py (make docs): edit the spec,"
             " not this table -->" % rel, "",
             "| variable | type | default | meaning |", "|---|---|---|---|"]
    for name, opt in tune_spec().items():
        lines.append("| `%s` | %s | %s | %s |" % (
            name, _type(opt), _default(opt, role_defaults).replace("|", "\\|"),
            _markdown(" ".join(opt.description))))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the file is stale")
    parser.add_argument("--file", default=DOC)
    args = parser.parse_args(argv)
    with open(args.file, encoding="utf-8") as fh:
        text = fh.read()
    new = replace_section(text, NAME, table())
    if args.check:
        if new != text:
            print("%s: the tune variables table is stale; run `make docs`" % args.file,
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        with open(args.file, "w", encoding="utf-8") as fh:
            fh.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
