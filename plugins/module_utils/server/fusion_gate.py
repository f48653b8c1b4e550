"""Where SGLang lets FlashInfer's allreduce fusion run, by release: the renderer never passes the
fusion flag for a GPU the installed SGLang refuses it on.

SGLang gates the fusion itself, by compute-capability major, whatever FlashInfer builds. From 0.5.14
it raises `ValueError("FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.")` at start on
any other GPU (sglang/srt/layers/flashinfer_comm_fusion.py, _resolve_backend: line 49 in 0.5.14, 48 in
0.5.23), so the server never comes up; before it the flag was accepted and the fusion never ran
(sglang/srt/layers/communicator.py apply_flashinfer_allreduce_fusion: line 100 in 0.5.10, 167 in
0.5.13.post1). The majors are those of utils/common.py's is_sm90_supported / is_sm100_supported.
Data here because module_utils travel to the GPU host without the role's files; the unit test
tests/unit/test_server_fusion_gate.py checks it against roles/sglang/vars/releases.yml, which
tools/sglang_release_facts.py reads from the wheels.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.server.versions import EngineVersion

# (first release, majors the fusion runs on, what SGLang does on the others, where), oldest first.
SGLANG_FUSION_GATES: Tuple[Tuple[Tuple[int, ...], Tuple[int, ...], str, str], ...] = (
    ((0,), (9, 10), "skip", "sglang/srt/layers/communicator.py apply_flashinfer_allreduce_fusion"),
    ((0, 5, 14), (9, 10), "refuse", "sglang/srt/layers/flashinfer_comm_fusion.py _resolve_backend"),
)
# Marks a note of a feature left out of the command (the manager files it under features_skipped).
NOT_RENDERED = ": not rendered: "
WHAT = {"refuse": "refuses it (the server would fail at start)", "skip": "accepts the flag but never runs it"}


def gate(version: EngineVersion) -> Tuple[Tuple[int, ...], str, str]:
    """(majors allowed, refuse|skip, source) of the SGLang release `version`."""
    chosen = SGLANG_FUSION_GATES[0]
    for entry in SGLANG_FUSION_GATES:
        if version.at_least(entry[0]):
            chosen = entry
    return chosen[1], chosen[2], chosen[3]


def _major(arch: str) -> Optional[int]:
    head = str(arch or "").strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def not_allowed(version: EngineVersion, archs: Optional[Sequence[str]]) -> List[str]:
    """The compute capabilities among `archs` on which SGLang `version` does not run the fusion."""
    majors = gate(version)[0]
    return sorted({str(a) for a in archs or [] if _major(a) is not None and _major(a) not in majors})


def not_rendered_note(version: EngineVersion, archs: Sequence[str]) -> str:
    majors, elsewhere, source = gate(version)
    return (f"flashinfer_allreduce_fusion{NOT_RENDERED}SGLang {version} {WHAT[elsewhere]} on SM "
            f"{', '.join(archs)}, allowing it on SM {'/'.join('%d.x' % m for m in majors)} only ({source}); "
            f"the server runs without the fusion")
