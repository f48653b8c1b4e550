"""docs/plugins/ is generated from the plugins' own DOCUMENTATION / EXAMPLES / RETURN
(tools/gen_plugin_docs.py, `make docs-plugins`): this fails when a plugin's docs changed and the
pages were not regenerated, or a page was edited by hand. About 5 s (two ansible-doc calls)."""
from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "plugins"


def test_docs_plugins_are_generated_from_the_plugins(tmp_path):
    out = tmp_path / "plugins"
    subprocess.run([sys.executable, str(REPO / "tools" / "gen_plugin_docs.py"), "--out", str(out)],
                   check=True, capture_output=True, text=True)
    generated = sorted(p.name for p in out.glob("*.md"))
    committed = sorted(p.name for p in DOCS.glob("*.md"))
    assert committed == generated, "docs/plugins/ has other pages than the plugins: run `make docs-plugins`"
    stale = [name for name in generated if not filecmp.cmp(out / name, DOCS / name, shallow=False)]
    assert not stale, f"docs/plugins/ is stale ({', '.join(stale)}): run `make docs-plugins`"


def test_every_module_and_callback_has_a_page():
    # The generator reads the plugin folders; a new module gets a page without touching it.
    modules = {p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if not p.stem.startswith("_")}
    pages = {p.stem.removeprefix("module_") for p in DOCS.glob("module_*.md")}
    assert modules == pages
    assert (DOCS / "callback_progress.md").is_file()
