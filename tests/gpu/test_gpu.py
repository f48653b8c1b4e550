"""The GPU checks under pytest (same functions as run_gpu_checks.py). Marked `gpu` by conftest,
skipped without a GPU."""
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def checks():
    import gpu_checks
    return gpu_checks


def test_reap_frees_gpu_memory_spares_decoy_and_protected(checks):
    checks.check_reap_frees_gpu_memory(checks.gpu_count())   # raises CheckFailed with details


def test_gpu_facts_agrees_with_nvidia_smi(checks):
    checks.check_gpu_facts_agrees_with_nvidia_smi()


def test_gpu_facts_reads_torch_of_a_venv(checks):
    pytest.importorskip("torch")
    checks.check_gpu_facts_venv()
