"""The generated sections of the documentation (tools/docgen/, `make docs`) are up to date: a
stale one fails here, naming the command that regenerates it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))

from docgen import bench_variables, tune_variables  # noqa: E402
from docgen.markers import MarkerError, replace_section  # noqa: E402


def test_the_readme_bench_variables_table_is_the_specs():
    with open(bench_variables.README, encoding="utf-8") as fh:
        text = fh.read()
    assert replace_section(text, bench_variables.NAME, bench_variables.table()) == text, (
        "README.md's bench variables table is stale: run `make docs`")


def test_the_tune_variables_table_is_the_tune_roles_spec():
    with open(tune_variables.DOC, encoding="utf-8") as fh:
        text = fh.read()
    assert replace_section(text, tune_variables.NAME, tune_variables.table()) == text, (
        "docs/tune.md's tune variables table is stale: run `make docs`")
    for name in tune_variables.tune_spec():
        assert "| `%s` |" % name in tune_variables.table(), name


def test_every_declared_option_has_a_row():
    table = bench_variables.table()
    for name in bench_variables.bench_spec():
        assert "| `%s` |" % name in table, name


def test_the_check_fails_on_a_stale_table(tmp_path):
    stale = tmp_path / "README.md"
    stale.write_text("# x\n<!-- bench-variables:begin -->\n| old |\n<!-- bench-variables:end -->\n")
    script = os.path.join(REPO, "tools", "docgen", "bench_variables.py")
    check = subprocess.run([sys.executable, script, "--check", "--file", str(stale)],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 1 and "make docs" in check.stderr
    subprocess.run([sys.executable, script, "--file", str(stale)], check=True)
    assert subprocess.run([sys.executable, script, "--check", "--file", str(stale)],
                          check=False).returncode == 0
    assert "| `bench_concurrency` |" in stale.read_text()


def test_a_file_without_the_markers_is_an_error():
    with pytest.raises(MarkerError):
        replace_section("no markers here", "bench-variables", "x")
