"""`pip install` of the checkout where it cannot build: no torch, a torch outside the supported
versions, missing system packages. Each must stop before anything is compiled, with one message
that names what to install or which flag to pass (python/package_build/torch_requirement.py,
cmake/PackageBuild.cmake). pip runs with --no-index: nothing is downloaded."""

import glob
import os
import subprocess
import sys
import sysconfig
import venv

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROJECT_SITE = sysconfig.get_paths()["purelib"]  # the project environment's, which runs these tests
BASE_PYTHON = os.environ.get("SENTINEL_BASE_PYTHON", "/usr/bin/python3")


def make_env(path, site_dirs):
    """A fresh environment whose site-packages also reads `site_dirs` (a .pth file)."""
    subprocess.run([BASE_PYTHON, "-m", "venv", str(path)], check=True)
    python = os.path.join(str(path), "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "refusal_test.pth"), "w") as pth:
        pth.write("".join(f"{d}\n" for d in site_dirs))
    return python


@pytest.fixture(scope="module")
def backend_only(tmp_path_factory):
    """An environment with the build backend (scikit-build-core and what it needs) and no torch."""
    work = tmp_path_factory.mktemp("backend_only")
    backend = work / "backend"
    backend.mkdir()
    for name in ("scikit_build_core", "pathspec", "packaging"):
        found = [os.path.join(PROJECT_SITE, name)] + glob.glob(os.path.join(PROJECT_SITE, f"{name}-*.dist-info"))
        assert len(found) == 2 and all(os.path.exists(f) for f in found), f"{name} in {PROJECT_SITE}: {found}"
        for entry in found:
            os.symlink(entry, backend / os.path.basename(entry))
    python = make_env(work / "env", [str(backend)])
    probe = subprocess.run([python, "-c", "import scikit_build_core; import torch"], capture_output=True, text=True)
    assert "No module named 'torch'" in probe.stderr, probe.stderr
    return python


def pip_install(python, build_dir, *settings, env=None):
    command = [python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--disable-pip-version-check",
               "--config-settings", f"build-dir={build_dir}",
               *[f"--config-settings={s}" for s in settings], ROOT]
    environment = dict(os.environ, **(env or {}))
    environment.pop("CMAKE_ARGS", None)
    done = subprocess.run(command, capture_output=True, text=True, cwd=str(build_dir.parent), env=environment)
    return done.returncode, done.stdout + done.stderr


def assert_nothing_compiled(output, build_dir):
    objects = glob.glob(os.path.join(str(build_dir), "**", "*.o"), recursive=True)
    assert not objects, f"compiled before refusing: {objects[:3]}"
    assert "Building CXX object" not in output and "Building CUDA object" not in output, output


def test_no_torch(backend_only, tmp_path):
    rc, output = pip_install(backend_only, tmp_path / "build")
    assert rc != 0, output
    assert "cannot import torch" in output, output
    assert "pip install 'torch>=2.11,<2.12'" in output, output
    assert "Nothing was compiled." in output, output
    assert_nothing_compiled(output, tmp_path / "build")


def test_torch_outside_supported_versions(backend_only, tmp_path):
    # A stand-in for another torch release: the check reads torch's version before anything else.
    fake = tmp_path / "other_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "2.10.0+cpu"\n')
    rc, output = pip_install(backend_only, tmp_path / "build", env={"PYTHONPATH": str(fake.parent)})
    assert rc != 0, output
    assert "torch 2.10.0+cpu" in output and str(fake.parent) in output, output
    assert "not one this package builds against (torch>=2.11,<2.12" in output, output
    assert "pip install 'torch>=2.11,<2.12'" in output, output
    assert_nothing_compiled(output, tmp_path / "build")


def torch_cuda_version():
    import torch
    return torch.version.cuda


def test_missing_system_packages_in_one_message(tmp_path):
    """fmt and yaml-cpp hidden from CMake's search, and no nvcc for the CUDA torch: all three named
    in one message, with the flag that builds without CUDA."""
    python = make_env(tmp_path / "env", [PROJECT_SITE])
    rc, output = pip_install(python, tmp_path / "build", "cmake.define.CMAKE_DISABLE_FIND_PACKAGE_fmt=ON",
                             "cmake.define.CMAKE_DISABLE_FIND_PACKAGE_yaml-cpp=ON",
                             env={"CUDACXX": str(tmp_path / "no_such_nvcc")})
    assert rc != 0, output
    assert "overflow-sentinel needs what this machine lacks; nothing was compiled." in output, output
    listed = [line.strip()[2:] for line in output.splitlines() if line.strip().startswith("- ")]
    expected = ["fmt (Debian, Ubuntu: libfmt-dev)", "yaml-cpp (Debian, Ubuntu: libyaml-cpp-dev)"]
    cuda = torch_cuda_version()
    if cuda:  # a CPU torch builds no kernels, and needs no nvcc
        expected.append(f"a CUDA toolkit (nvcc) for torch's CUDA {cuda} (or CUDACXX naming its nvcc)")
        assert "--config-settings=cmake.define.SENTINEL_ENABLE_CUDA=OFF" in output, output
    assert listed == expected, output
    assert_nothing_compiled(output, tmp_path / "build")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
