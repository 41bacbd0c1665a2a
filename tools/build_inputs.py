"""Build inputs that come from Python packages, at paths that outlive one build.

pip builds in an isolated environment under a new temporary folder each time.
Compiling nanobind, XLA's FFI headers or a CUDA toolkit from PyPI straight
from there changes every compile command on the next install, and the whole
extension rebuilds. This script copies each input into the build folder,
keyed by the package's version, so a repeated install with the same versions
finds the same paths and unchanged files, and recompiles nothing.

CMakeLists.txt runs it with the build's Python; the build backend
(tools/jaxcraft_build.py) imports it for the CUDA wheels to request.

  python tools/build_inputs.py nanobind DEST       -> nanobind's CMake folder
  python tools/build_inputs.py ffi-include DEST    -> XLA's FFI include folder
  python tools/build_inputs.py cuda-toolkit DEST   -> a CUDA toolkit root, or nothing
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import shutil
import sys

# The PyPI packages that together hold CUDA 13's compiler toolkit, all
# installed under site-packages/nvidia/cu13: nvcc, ptxas and fatbinary; cicc
# and libdevice (nvvm); the headers nvcc's front end needs (crt, cccl); the
# runtime's headers and static library. CUDA 12 has no such set on PyPI (its
# nvcc wheel holds ptxas alone), so a CUDA 12 build needs a system toolkit.
CUDA_WHEELS = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime",
               "nvidia-cuda-cccl")
CUDA_WHEELS_MAJOR = 13


def cuda_requirements() -> list[str]:
  return [f"{name}>={CUDA_WHEELS_MAJOR}.0,<{CUDA_WHEELS_MAJOR + 1}" for name in CUDA_WHEELS]


def _versions(names) -> str:
  return " ".join(f"{n}=={importlib.metadata.version(n)}" for n in names)


def _mirror(files: dict[str, pathlib.Path], dest: pathlib.Path, stamp: str) -> pathlib.Path:
  """Copies `files` (relative destination -> source) into `dest` unless
  `dest` already holds the copy described by `stamp`; file times are kept,
  so the build sees unchanged inputs."""
  stamp_file = dest / ".jaxcraft-stamp"
  if stamp_file.exists() and stamp_file.read_text() == stamp:
    return dest
  shutil.rmtree(dest, ignore_errors=True)
  for rel, source in files.items():
    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, dest / rel)
  stamp_file.write_text(stamp)
  return dest


def _tree(root: pathlib.Path) -> dict[str, pathlib.Path]:
  return {p.relative_to(root).as_posix(): p for p in root.rglob("*")
          if p.is_file() and "__pycache__" not in p.parts}


def nanobind(dest: pathlib.Path) -> pathlib.Path:
  import nanobind as nb
  return _mirror(_tree(pathlib.Path(nb.__file__).parent), dest, _versions(["nanobind"])) / "cmake"


def ffi_include(dest: pathlib.Path) -> pathlib.Path:
  import jaxlib
  include = pathlib.Path(jaxlib.__file__).parent / "include"
  return _mirror(_tree(include), dest, _versions(["jaxlib"]))


def cuda_toolkit(dest: pathlib.Path) -> pathlib.Path | None:
  """A CUDA toolkit root made of the CUDA wheels' files (only theirs: JAX's
  CUDA libraries share site-packages/nvidia/cu13), or None when a wheel of
  the set is not installed for this Python."""
  prefix = f"nvidia/cu{CUDA_WHEELS_MAJOR}/"
  files = {}
  try:
    for name in CUDA_WHEELS:
      dist = importlib.metadata.distribution(name)
      for f in dist.files or ():
        if f.as_posix().startswith(prefix):
          files[f.as_posix()[len(prefix):]] = pathlib.Path(dist.locate_file(f))
  except importlib.metadata.PackageNotFoundError:
    return None
  root = _mirror(files, dest, _versions(CUDA_WHEELS))
  # The runtime wheel ships libcudart.so.13 alone; CMake's FindCUDAToolkit
  # looks for the development name a toolkit has beside it.
  cudart = root / "lib" / "libcudart.so"
  if not cudart.exists():
    cudart.symlink_to(f"libcudart.so.{CUDA_WHEELS_MAJOR}")
  return root


def main(argv):
  what, dest = argv[1], pathlib.Path(argv[2])
  path = {"nanobind": nanobind, "ffi-include": ffi_include, "cuda-toolkit": cuda_toolkit}[what](dest)
  if path is not None:
    print(path.as_posix())


if __name__ == "__main__":
  main(sys.argv)
