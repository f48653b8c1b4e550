"""Local PyPI "simple" indexes for the lab tests: stand-in wheels of torch, SGLang and FlashInfer.

    from pypirepo import StackVersions, build_stack_indexes
    indexes = build_stack_indexes(tmp / "pypi")          # serve tmp/"pypi" over HTTP, then
    url + indexes.torch("13.0"), url + indexes.pypi, url + indexes.flashinfer("13.0")
"""
from .index import write_simple_index
from .stack import StackIndexes, StackVersions, build_stack_indexes, cuda_tag
from .wheel import build_wheel, normalize

__all__ = ["write_simple_index", "StackIndexes", "StackVersions", "build_stack_indexes", "cuda_tag",
           "build_wheel", "normalize"]
