#!/usr/bin/env python3
"""The folders of src/ form layers: no folder includes, directly or through others, a folder that
includes it back. And exactly one file reads LibTorch's RecordFunction (its layout depends on
NDEBUG): src/capture/record_hooks.cpp. Prints what breaks either rule and exits 1."""
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
src = os.path.join(root, "src")
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
edges = {f: {} for f in folders}  # folder -> {included folder: a file that includes it}
problems = []
for folder in folders:
    for dirpath, _, names in os.walk(os.path.join(src, folder)):
        for name in names:
            if not name.endswith((".h", ".cpp", ".cuh", ".cu")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            text = open(path, encoding="utf-8").read()
            for target in include.findall(text):
                top = target.split("/")[0]
                if top in edges and top != folder:
                    edges[folder].setdefault(top, rel)
            if "ATen/record_function.h" in text and rel != "src/capture/record_hooks.cpp":
                problems.append(f"{rel} includes ATen/record_function.h: only src/capture/record_hooks.cpp may")


def reaches(a, b, seen=None):
    seen = seen if seen is not None else set()
    for nxt in edges[a]:
        if nxt == b:
            return True
        if nxt not in seen:
            seen.add(nxt)
            if reaches(nxt, b, seen):
                return True
    return False


for a in folders:
    for b, where in sorted(edges[a].items()):
        if reaches(b, a):
            problems.append(f"src/{a} includes src/{b} ({where}), and src/{b} reaches src/{a} back")
for p in problems:
    print("check_layers:", p)
if problems:
    sys.exit(1)
order = " ".join(f"{a}<-{','.join(sorted(edges[a]))}" for a in folders if edges[a])
print(f"check_layers: {len(folders)} folders, no cycles ({order})")
