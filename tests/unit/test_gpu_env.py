"""tests/gpu/gpu_env.py: what every GPU process the GPU checks start inherits."""


def test_gpu_children_run_with_nvlink_multicast_off(monkeypatch):
    """Every GPU process the GPU checks start keeps NVLink multicast off, whatever the caller's
    environment says (shared multi-GPU hosts)."""
    import sys as _sys
    import os as _os
    here = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "gpu")
    if here not in _sys.path:
        _sys.path.insert(0, here)
    import gpu_env
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = gpu_env.gpu_child_env()
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
