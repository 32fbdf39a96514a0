"""`sentinel`, the command-line tool, as pip installs it (the console script of pyproject.toml).

The binary is bundled in the package (bin/sentinel) and links LibTorch's libraries, which live in
the torch package of this environment, not where the dynamic loader looks. The package has
already imported torch (and checked it is the torch the binary was built against); this runs the
binary in place of the Python process with that torch's lib directory, and the CUDA runtime
torch ships beside it, first on its library path.
"""

import glob
import os
import sys

import torch

_BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "sentinel")


def library_dirs():
    """torch's lib directory, then any of its pip-installed CUDA runtimes (nvidia/*/lib)."""
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    runtimes = glob.glob(os.path.join(os.path.dirname(torch_dir), "nvidia", "*", "lib", "libcudart.so*"))
    return [os.path.join(torch_dir, "lib")] + sorted({os.path.dirname(found) for found in runtimes})


def main():
    if not os.access(_BINARY, os.X_OK):
        sys.exit(f"sentinel: this installation of overflow_sentinel has no command-line tool at {_BINARY}: "
                 "reinstall the package from the project's checkout (pip install --no-build-isolation .)")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(library_dirs() + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
    sys.stdout.flush()
    os.execve(_BINARY, ["sentinel", *sys.argv[1:]], env)
