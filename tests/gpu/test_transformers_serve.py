"""A real engine (`transformers serve`, continuous batching, random-weight Llama) started, probed,
loaded and stopped through llm_server's logic; GPU memory must come back. Marked `gpu` by
tests/gpu/conftest.py and skipped without a GPU. The same run as one command (no pytest, no
Ansible): tests/gpu/engine/run_transformers_serve.py, whose docstring has the line."""
import json
import os
import sys

import pytest

pytestmark = pytest.mark.gpu
HERE = os.path.dirname(os.path.abspath(__file__))


def test_transformers_serve_through_the_launcher(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("fastapi", reason="transformers serve needs fastapi/uvicorn "
                                          "(tests/gpu/engine/fetch-wheels.sh)")
    sys.path.insert(0, os.path.join(HERE, "engine"))
    import run_transformers_serve as runner
    out = tmp_path / "out"
    code = runner.main(["--out", str(out), "--levels", "1,8", "--level-seconds", "5",
                        "--hidden", "1024", "--layers", "4",
                        "--model-dir", str(tmp_path / "model")])
    summary = json.loads((out / "summary.json").read_text())
    failed = [name for name, ok in summary["checks"].items() if not ok]
    assert code == 0 and not failed, f"failed checks {failed}: {summary['error']}"
    assert summary["start"]["ready_seconds"] > 0
    assert [r["concurrency"] for r in summary["levels"]] == [1, 8]
