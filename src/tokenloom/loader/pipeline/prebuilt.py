"""The compiled packer built ahead of time, for DataLoader workers, which must not load numba.

:func:`tokenloom.loader.plan._pack_jit.pack_rows` is compiled once per machine by numba's
ahead-of-time compiler (``numba.pycc``) into a plain extension module whose functions need
neither numba nor LLVM at run time: a DataLoader worker packs with it. Loading numba and LLVM
costs a process ~115 MB of RSS (measured, 400k documents, two workers: 257 -> 372 MB a worker,
the loader tree 921 -> 1,147 MB, past its 1 GB goal), so workers packed with the numpy packer,
which costs them about twice the compiled one's CPU a token; the prebuilt module costs ~0.3 MB.

* The training process builds it (:func:`ensure`, in a child process) before it starts
  DataLoader workers, the first time on a machine (~15 s of CPU: numba compiles the kernel for
  each token type of :data:`DTYPES`, then a C compiler links it). Every later process only loads
  the file.
* A worker loads it (:func:`load`) and never builds, and packs with it
  (:func:`tokenloom.loader.plan.pack.use_prebuilt`). Where it cannot be built (no C compiler, a
  numba without ``pycc``) workers pack with numpy, as before, and the training process warns
  once why; the batches are the same either way.
* The file's name holds a key of the kernel's source, the exported signatures, numba's and
  numpy's versions and the interpreter, so an edited kernel or an upgrade builds a new file. Its
  code is for the generic CPU of the architecture (``pycc``'s default), so a cache shared by
  machines of one architecture stays valid.
* Where: ``$TOKENLOOM_KERNEL_CACHE`` when set, else beside the kernel module (its
  ``__pycache__``, where numba caches the JIT kernels) when writable, else
  ``~/.cache/tokenloom/kernels``. Concurrent builders (ranks of one node) take a file lock; the
  file appears whole (renamed into place).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["DTYPES", "CACHE_ENV", "can_build", "ensure", "load", "path"]

DTYPES = ("uint16", "int32", "uint32", "int64")
"""Token types the module packs: what tokenloom's tokenizers write (``uint16``, ``int32`` above
65,536 ids), ``uint32`` and ``int64`` (tables written elsewhere). Others pack with numpy."""
CACHE_ENV = "TOKENLOOM_KERNEL_CACHE"

# pack_rows's arguments (tokenloom.loader.plan.pack._pack_compiled passes them in this order),
# with {v} the token type of ``values`` and ``extra``
_SIGNATURE = (
    "int64({v}[::1], {v}[::1], int64[::1], int64[::1], boolean[::1], boolean, int64[::1], "
    "int64[::1], int64[::1], int64[::1], int64[::1], boolean[::1], int64[::1], boolean, "
    "boolean[::1], boolean, boolean, boolean, int64, int64, int64, int64[:, :, ::1], int32[::1], "
    "int64[::1], int64[::1], int64[::1])"
)
_KERNEL_MODULE = "tokenloom.loader.plan._pack_jit"
_BUILD_TIMEOUT_S = 600  # ~15 s on 2 cores

_lock = threading.Lock()
_loaded: dict[Path, ModuleType] = {}
_failed: str | None = None  # why this process could not build it (warned once)


def _kernel_file() -> Path:
    spec = importlib.util.find_spec(_KERNEL_MODULE)  # found, not imported (that imports numba)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


@functools.cache
def _name() -> str:
    """The module's name: ``_tokenloom_pack_`` and the key of what it is built from (worked out
    once a process: a worker asks at every pass)."""
    h = hashlib.sha256()
    for part in (
        Path(__file__).read_bytes(),  # how it is built
        _kernel_file().read_bytes(),
        (_kernel_file().parent / "_jit.py").read_bytes(),
        _SIGNATURE.encode(),
        ",".join(DTYPES).encode(),
        importlib.metadata.version("numba").encode(),
        np.__version__.encode(),
        sys.implementation.cache_tag.encode(),
    ):
        h.update(part)
        h.update(b"\0")
    return f"_tokenloom_pack_{h.hexdigest()[:16]}"


def _dirs() -> list[Path]:
    env = os.environ.get(CACHE_ENV)
    if env:
        return [Path(env).expanduser()]
    return [
        _kernel_file().parent / "__pycache__",
        Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "tokenloom" / "kernels",
    ]


def path() -> Path | None:
    """Where the module for this kernel and interpreter is, if it has been built."""
    file = _name() + importlib.machinery.EXTENSION_SUFFIXES[0]
    for d in _dirs():
        if (d / file).is_file():
            return d / file
    return None


def load() -> ModuleType | None:
    """The prebuilt module (``pack_rows_<dtype>`` for each of :data:`DTYPES`), loaded without
    numba; ``None`` where it has not been built. Never builds."""
    found = path()
    if found is None:
        return None
    with _lock:
        module = _loaded.get(found)
        if module is None:
            loader = importlib.machinery.ExtensionFileLoader(found.name.split(".")[0], str(found))
            spec = importlib.util.spec_from_file_location(loader.name, found, loader=loader)
            assert spec is not None
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            _loaded[found] = module
    return module


def can_build() -> bool:
    """Whether this machine has the C compiler the build links with (the interpreter's)."""
    import shlex
    import shutil
    import sysconfig

    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    return bool(cc) and shutil.which(cc[0]) is not None


def ensure() -> Path | None:
    """Build the module unless it is there (the training process, before its workers start):
    its path, or ``None`` where it cannot be built (warned once a process, with the reason)."""
    global _failed
    found = path()
    if found is not None or _failed is not None:
        return found
    name = _name()
    errors = [] if can_build() else ["no C compiler (the interpreter's CC, or $CC) on PATH"]
    for d in _dirs() if not errors else []:
        try:
            d.mkdir(parents=True, exist_ok=True)
            with open(d / f"{name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it
                target = d / (name + importlib.machinery.EXTENSION_SUFFIXES[0])
                if not target.is_file():
                    _compile(name, d, target)
            return target
        except Exception as exc:  # noqa: BLE001 - any failure: workers pack with numpy
            errors.append(f"{d}: {type(exc).__name__}: {exc}")
    _failed = "; ".join(errors)
    warnings.warn(
        "DataLoader workers pack with the numpy packer (about twice the compiled one's CPU a "
        f"token): the prebuilt packer could not be built ({_failed})",
        RuntimeWarning,
        stacklevel=2,
    )
    return None


def _compile(name: str, directory: Path, target: Path) -> None:
    """Build the module into ``target`` in a child process (:func:`_build`): the training
    process never holds numba, LLVM and the compiler's memory (measured: a first run's loader
    tree with two workers peaked at 1,071 MB with the build in the training process, against
    911-918 MB once built)."""
    done = subprocess.run(
        [sys.executable, "-m", __name__, name, str(directory), str(target)],
        capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0 or not target.is_file():
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"the build exited with {done.returncode}: {tail}")


def _build(name: str, directory: Path, target: Path) -> None:
    """Compile the kernel for each token type into ``target`` (through a temporary directory
    of ``directory``, renamed into place whole). The exported functions let go of the
    interpreter lock while they run, as the JIT kernel does (``nogil=True``): a worker's other
    threads (its takes, its messages) go on meanwhile; pycc has no option for it, so its
    compilation flags are given ``release_gil`` for the duration of the build."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending deprecation, numba's notes
        from numba.pycc import CC
        from numba.pycc import compiler as pycc_compiler

        from tokenloom.loader.plan._pack_jit import pack_rows

        plain = pycc_compiler.Flags

        class Flags(plain):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.release_gil = True

        with tempfile.TemporaryDirectory(dir=directory, prefix=f".{name}-") as tmp:
            cc = CC(name)
            cc.output_dir = tmp
            cc.verbose = False
            for dtype in DTYPES:
                cc.export(f"pack_rows_{dtype}", _SIGNATURE.format(v=dtype))(pack_rows.py_func)
            pycc_compiler.Flags = Flags
            try:
                cc.compile()
            finally:
                pycc_compiler.Flags = plain
            built = Path(tmp) / target.name
            if not built.is_file():
                raise FileNotFoundError(f"numba.pycc wrote no {target.name}")
            os.replace(built, target)


if __name__ == "__main__":  # the child process of :func:`_compile`
    _build(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
