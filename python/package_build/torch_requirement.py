"""The package's torch requirement, read from the torch it is built against (pyproject.toml).

scikit-build-core asks this module for the package's dependencies before it configures anything,
so the torch check lives here and runs before the first compile. The native part is compiled
against the installing environment's LibTorch, whose C++ ABI changes with each minor version of
torch: that torch must be importable, within the versions the project builds against, and the wheel
asks for exactly it. What else the build needs is checked by cmake/PackageBuild.cmake.
"""

import sys


def _refuse(problem, remedy):
    """Stops the build with one message: pip prints it with the backend's output."""
    sys.stderr.write(f"\noverflow-sentinel: {problem}\n  {remedy}\nNothing was compiled.\n\n")
    sys.stderr.flush()
    raise SystemExit(1)


def _isolated():
    """Whether pip (or `python -m build`) runs this build in an environment of its own."""
    return any("build-env-" in entry for entry in sys.path)


def _torch(supported):
    wanted = f"pip install 'torch{supported}'"
    try:
        import torch
    except ImportError as error:
        if _isolated():
            _refuse("the build runs in pip's isolated environment, which has no torch to build against.",
                    "Build in the environment that holds your torch: pip install --no-build-isolation ... "
                    "(with scikit-build-core installed there: pip install scikit-build-core).")
        _refuse(f"{sys.executable} cannot import torch ({error}).",
                f"Install torch into this environment first ({wanted}), then run pip install "
                "--no-build-isolation again.")
    return torch


def dynamic_metadata(settings, project):
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    wanted = settings["supported"]  # as pyproject.toml writes it: SpecifierSet reorders it
    supported = SpecifierSet(wanted)
    torch = _torch(wanted)
    where = torch.__file__.rsplit("/", 2)[0]
    try:
        version = Version(torch.__version__)
    except InvalidVersion:
        version = None
    # A torch built from source says 2.11.0a0+git...: a pre-release of the same minor version.
    if version is None or not supported.contains(version, prereleases=True):
        _refuse(f"torch {torch.__version__} (in {where}) is not one this package builds against "
                f"(torch{wanted}: a torch extension's C++ ABI changes with each minor version).",
                f"Install a supported torch into this environment (pip install 'torch{wanted}'), or "
                "build in an environment that has one.")
    return {"dependencies": [f"torch=={version.public}"]}
