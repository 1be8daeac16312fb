"""Import shims that let SGLang's radix cache load on a CPU-only machine (tests and benchmarks only).

SGLang 0.5.23 is installed there with `pip install --no-deps` beside the CPU build of
torch 2.13.0 (scripts/make_sglang_env.sh). Two imports on the chain to
`sglang.srt.mem_cache.radix_cache` then fail, and `install()` fixes both:

* `import triton`: triton ships no CPU wheel worth installing. SGLang carries a stub for
  it (`sglang/_platform_stubs.py`), but installs it only on Apple Silicon. We load that
  file by path -- without importing the `sglang` package, whose `__init__` is what needs
  triton -- and register its mock modules and meta-path finder, plus the few names that
  torch and SGLang use as *types* (isinstance / subclassing) and so must be real classes.
* `import torchvision`: PyPI's torchvision wheel is built against CUDA torch; beside CPU
  torch its C++ extension does not load, so `torchvision::nms` is never defined and
  torchvision's own `register_fake("torchvision::nms")` raises "operator torchvision::nms
  does not exist". If torchvision's extension cannot load, defining the `nms` / `qnms` op
  schemas first (no kernels, never called: the radix cache does not use torchvision) lets the
  import finish; a torchvision built for this torch loads its own ops and is left alone.

The real HTTP server on CPU (`hardware=cpu`, SGLANG_USE_CPU_ENGINE=1) also needs `sgl_kernel`,
SGLang's compiled kernels, which have no CPU wheel: with `SGLANG_USE_CPU_ENGINE=1` the memory pool
and speculative-decoding utils import a few `*_cpu` ops at import time (none is called with the
torch_native attention backend). `install(sgl_kernel=True)` adds a stand-in package whose names are
functions that raise NotImplementedError naming the kernel when called, so a kernel the CPU server
really needed would fail loudly; `sgl_kernel.<submodule>` still raises ImportError, which SGLang's
own fallbacks handle. repro.backends.sglang.server installs all three when
REPRO_SGLANG_CPU_SHIMS=1 (set by conf/hardware/cpu.yaml); the GPU path never does.
Idempotent: a second `install()` is a no-op.
"""

from __future__ import annotations

import glob
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

_installed = False
_library = None  # keep the torch.library.Library alive: dropping it removes the op schemas


def _load_sglang_platform_stubs():
    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        # origin None: only a namespace package (e.g. the tests/sglang folder on sys.path)
        raise ImportError("sglang is not installed (make the env with scripts/make_sglang_env.sh)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "_platform_stubs.py")
    name = "_repro_sglang_platform_stubs"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module  # dataclasses in the file look their module up in sys.modules
    mod_spec.loader.exec_module(module)
    return module


def _install_triton_stub() -> None:
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        return  # a real triton is importable: leave it alone
    stubs = _load_sglang_platform_stubs()
    sys.meta_path.insert(0, stubs._TritonFinder())

    triton = stubs._make_mock("triton")
    triton.__version__ = "3.0.0"
    triton.cdiv = stubs._cdiv
    triton.next_power_of_2 = stubs._next_power_of_2
    triton.Config = stubs._Config

    language = stubs._make_mock("triton.language")

    class constexpr:  # used as an annotation and as a value wrapper
        def __init__(self, value=None):
            self.value = value

    language.constexpr = constexpr
    triton.language = language

    # Names that torch (flop_counter, inductor) and SGLang use in isinstance() or as base
    # classes: they must be classes, not the stub's auto-created sub-modules.
    runtime = stubs._make_mock("triton.runtime")
    triton.runtime = runtime
    jit = stubs._make_mock("triton.runtime.jit")
    jit.JITFunction = type("JITFunction", (), {})
    jit.KernelInterface = type("KernelInterface", (stubs._StubBase,), {})
    runtime.jit = jit
    runtime.JITFunction = jit.JITFunction
    runtime.KernelInterface = jit.KernelInterface
    autotuner = stubs._make_mock("triton.runtime.autotuner")
    autotuner.OutOfResources = type("OutOfResources", (Exception,), {})
    autotuner.PTXASError = type("PTXASError", (Exception,), {})
    runtime.autotuner = autotuner
    cache = stubs._make_mock("triton.runtime.cache")
    cache.triton_key = stubs._triton_key
    runtime.cache = cache
    compiler = stubs._make_mock("triton.compiler")
    compiler.CompiledKernel = type("CompiledKernel", (stubs._StubBase,), {})
    compiler_impl = stubs._make_mock("triton.compiler.compiler")
    compiler_impl.ASTSource = type("ASTSource", (stubs._StubBase,), {})
    compiler_impl.triton_key = stubs._triton_key
    compiler.compiler = compiler_impl
    triton.compiler = compiler
    backends = stubs._make_mock("triton.backends")
    backends_compiler = stubs._make_mock("triton.backends.compiler")
    backends_compiler.GPUTarget = type("GPUTarget", (stubs._StubBase,), {})
    backends.compiler = backends_compiler
    triton.backends = backends


def _define_torchvision_ops() -> None:
    global _library
    if "torchvision" in sys.modules:
        return
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: nothing to fix
    import torch

    ext = glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "_C*.so"))
    if ext:
        try:
            torch.ops.load_library(ext[0])
            return  # a torchvision built for this torch: its real ops are registered now
        except (OSError, RuntimeError):
            pass  # built against CUDA torch: define the schemas torchvision's import expects
    _library = torch.library.Library("torchvision", "DEF")
    _library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class _SglKernelStub(types.ModuleType):
    """`sgl_kernel` on a machine without it: every name is a kernel that raises when called."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []  # a package, so `from sgl_kernel import x` works; submodules stay ImportError
        self.__version__ = "0.0.0+repro-cpu-stub"
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        qualname = f"{self.__name__}.{attr}"

        def kernel(*args, **kwargs):
            raise NotImplementedError(f"{qualname}: sgl_kernel is a stub on this CPU machine (no CPU wheel)")

        kernel.__name__ = attr
        kernel.__qualname__ = qualname
        return kernel


class _SglKernelFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True) if fullname == "sgl_kernel" else None

    def create_module(self, spec):
        return _SglKernelStub(spec.name)

    def exec_module(self, module):
        pass


def _install_sgl_kernel_stub() -> None:
    if importlib.util.find_spec("sgl_kernel") is not None:
        return  # a real sgl_kernel is importable: leave it alone
    sys.meta_path.insert(0, _SglKernelFinder())


def install(sgl_kernel: bool = False) -> None:
    """Make `import sglang.srt.mem_cache.radix_cache` work on CPU (and, with `sgl_kernel=True`, the
    HTTP server's import chain). Call before importing sglang."""
    global _installed
    if not _installed:
        _install_triton_stub()
        _define_torchvision_ops()
        _installed = True
    if sgl_kernel:
        _install_sgl_kernel_stub()
