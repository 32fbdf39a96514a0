"""The package's modules import one another without a circle, deferred imports inside functions
included: each can be read, tested and changed from the bottom up (the front ends, `trainer`,
`accelerate`, `lightning`, import the package; nothing in it imports them)."""

import ast
import pathlib

import overflow_sentinel

PACKAGE = pathlib.Path(overflow_sentinel.__file__).parent


def imports_of(path, modules):
    """The package's modules `path` imports: `from .x import y` names x; `from . import y` names y
    when y is a module of the package, else the package itself."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or node.level != 1:
            continue
        if node.module:
            found.add(node.module.split(".")[0])
        else:
            found.update(a.name if a.name in modules else "__init__" for a in node.names)
    return found & modules


def circle(edges):
    """A list of modules that import each other in a circle, or None."""
    state, stack = {}, []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for dep in sorted(edges[name]):
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[name] = "done"
        stack.pop()
        return None

    for name in sorted(edges):
        if name not in state and (found := visit(name)):
            return found
    return None


def test_the_circle_finder_finds_a_circle():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None


def test_the_packages_modules_import_one_another_without_a_circle():
    files = {p.stem: p for p in PACKAGE.glob("*.py")}
    edges = {name: imports_of(path, set(files)) - {name} for name, path in files.items()}
    assert {"_compiled", "_hooks", "_replay"} <= set(edges)
    assert circle(edges) is None, " -> ".join(circle(edges))
