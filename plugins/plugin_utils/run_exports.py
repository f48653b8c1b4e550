"""The Parquet exports llm_bench writes after each level: levels.parquet and requests.parquet,
the bytes bench_report writes (report/export.py parquet_files), so a run measured without the
report step (llm_bench alone, or a run cut short before it) still has them for pandas, polars
and DuckDB.

pandas and pyarrow are the collection's controller requirements (requirements.txt), which
llm_bench itself does not need: without them it writes levels.csv and requests.jsonl as ever,
and its result says why the Parquet files are not there and how to install what they need.
Called under the run's lock (llm_bench's _record_level), after levels.csv is rebuilt.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    PARTS_DIR, write_if_changed,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import read_parts
from ansible_collections.servelab.serving.plugins.plugin_utils import controller_requirements
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import (
    ManifestError, read_manifest,
)

# What the Parquet files need (import name, distribution): the report's own, less its plotting.
PARQUET_PACKAGES = (("pandas", "pandas"), ("pyarrow", "pyarrow"))


@dataclass
class ParquetOutcome:
    """What write_parquet_exports did: the files whose bytes changed, or why none was written."""
    written: List[str] = field(default_factory=list)   # paths relative to the run directory
    note: Optional[str] = None                          # the reason, when nothing was written


def missing_note(lacking: List[str]) -> str:
    """The sentence llm_bench's result gives when `lacking` packages keep it from the files."""
    return ("levels.parquet and requests.parquet not written: they need %s, which the Python "
            "that runs Ansible cannot import; levels.csv and requests.jsonl are written. Install "
            "them with: %s (bench_report needs them too)"
            % (" and ".join(lacking), controller_requirements.install_command()))


def write_parquet_exports(run_dir: str,
                          missing: Callable[..., List[str]] = controller_requirements.missing
                          ) -> ParquetOutcome:
    """Write the run's levels.parquet and requests.parquet from all its parts (the files whose
    bytes changed only). Never raises: a level already written must not be lost to an export."""
    lacking = missing(PARQUET_PACKAGES)
    if lacking:
        return ParquetOutcome(note=missing_note(lacking))
    try:
        # Imported here: the report package needs pandas at import time.
        from ansible_collections.servelab.serving.plugins.plugin_utils.report.export import (
            parquet_files,
        )
        try:
            manifest = read_manifest(run_dir)
        except ManifestError:
            manifest = {}     # the run's describing columns stay empty; bench_report says why
        parts = read_parts(os.path.join(run_dir, PARTS_DIR))
        # The run id bench_report names the rows with (report/data.py load_run).
        run_id = str(manifest.get("run_id") or os.path.basename(os.path.realpath(run_dir)))
        files = parquet_files([row for row, _jsonl in parts],
                              [jsonl for _row, jsonl in parts if os.path.isfile(jsonl)],
                              manifest, run_id)
        outcome = ParquetOutcome()
        for rel, data in sorted(files.items()):
            if write_if_changed(os.path.join(run_dir, rel), data):
                outcome.written.append(rel)
        return outcome
    except Exception as exc:  # noqa: BLE001 - an export never fails a measured level
        return ParquetOutcome(note="levels.parquet and requests.parquet not written: %s: %s"
                                   % (type(exc).__name__, exc))
