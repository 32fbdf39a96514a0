#!/usr/bin/env python3
"""The zoo of make_zoo.py, scripted once per machine instead of once per build directory.

    cached_zoo.py OUT_DIR

Scripting the zoo takes a minute of one core; its files depend only on make_zoo.py and on the
torch and torchvision that run it. They are kept outside the checkout, beside the project's
other caches (docs/platform.md), under a key made of those three, and copied into OUT_DIR. A
moved pin or an edited make_zoo.py gives a new key: the zoo is scripted again and the older one
removed. SENTINEL_ZOO_CACHE=0 scripts it straight into OUT_DIR.
"""
import hashlib
import os
import shutil
import subprocess
import sys

import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_ZOO = os.path.join(HERE, "make_zoo.py")


def cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "overflow-sentinel")


def zoo_key():
    digest = hashlib.sha256()
    with open(MAKE_ZOO, "rb") as f:
        digest.update(f.read())
    digest.update(f"torch {torch.__version__} torchvision {torchvision.__version__}".encode())
    return digest.hexdigest()[:16]


def script_zoo(out_dir):
    subprocess.run([sys.executable, MAKE_ZOO, out_dir], check=True)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: cached_zoo.py OUT_DIR")
    out_dir = sys.argv[1]
    if os.environ.get("SENTINEL_ZOO_CACHE") == "0":
        script_zoo(out_dir)
        return
    root = cache_root()
    kept = os.path.join(root, f"zoo-{zoo_key()}")
    if not os.path.isfile(os.path.join(kept, "zoo.json")):
        # Scripted aside and renamed into place, so that a run stopped halfway (or two at once)
        # never leaves a partial zoo under the key.
        os.makedirs(root, exist_ok=True)
        partial = f"{kept}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        script_zoo(partial)
        try:
            os.rename(partial, kept)
        except OSError:  # another run put its zoo there first
            shutil.rmtree(partial, ignore_errors=True)
        for entry in os.listdir(root):
            if entry.startswith("zoo-") and os.path.join(root, entry) != kept and ".partial-" not in entry:
                shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
        print(f"cached_zoo: scripted the zoo into {kept}")
    else:
        print(f"cached_zoo: the zoo of {kept}, scripted earlier by the same make_zoo.py, torch and torchvision")
    # Copies, not links: a test that wrote into its zoo must not change the kept one.
    shutil.copytree(kept, out_dir, dirs_exist_ok=True)


if __name__ == "__main__":
    main()
