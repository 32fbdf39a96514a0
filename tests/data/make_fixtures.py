#!/usr/bin/env python3
"""Regenerate the test fixtures in tests/data/ with Python's PyTorch.

The fixtures are genuine Python output (TorchScript archives written by
torch.jit.save, input batches written by torch.save) so that the C++ loader
is tested against files it did not write itself.

Usage (from the repository root):

    bash scripts/setup.sh
    scripts/python.sh tests/data/make_fixtures.py

Everything is deterministic: weights and clean inputs come from fixed seeds,
and running the script twice produces byte-identical files.  Only this script
needs Python; the project's tests only read the files it writes.
"""

import json
import math
import os
import shutil
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))


def out_path(name):
    return os.path.join(HERE, name)


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


class Block(nn.Module):
    """A trivial residual-free block, so TinyMLP has nested module paths."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x)


class TinyMLP(nn.Module):
    """fc1 -> act -> blocks[0].lin -> blocks[1].lin -> fc2.

    named_modules() paths: "", fc1, act, blocks, blocks.0, blocks.0.lin,
    blocks.1, blocks.1.lin, fc2 (in that order, the attribute order below).
    """

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        x = self.act(self.fc1(x))
        for block in self.blocks:
            x = block(x)
        return self.fc2(x)


class Doubler(nn.Module):
    """Submodule of TwoInput: returns 2 * x."""

    def forward(self, x):
        return x * 2


class TwoInput(nn.Module):
    """forward(x, y) = x * 2 + y (the doubling happens in a submodule)."""

    def __init__(self):
        super().__init__()
        self.double_x = Doubler()

    def forward(self, x, y):
        return self.double_x(x) + y


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def json_number(v):
    """JSON has no inf/nan: encode them as the strings "inf", "-inf", "nan".

    Finite values are written as Python floats; a float32 value converted to
    a Python float and printed with repr() parses back to exactly the same
    float32 value, so C++ tests may compare fp32 outputs for equality.
    """
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def tensor_to_json(t):
    """Nested lists of numbers (see json_number) for a tensor of any rank."""
    if t.dim() == 0:
        return json_number(t.item())
    return [tensor_to_json(s) for s in t]


def compact_json(value, indent=""):
    """Indented JSON that keeps short lists and objects on a single line."""
    flat = json.dumps(value, allow_nan=False)
    if len(flat) + len(indent) <= 100 or not isinstance(value, (list, dict)):
        return flat
    inner = indent + "  "
    if isinstance(value, list):
        items = [inner + compact_json(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    items = [inner + json.dumps(k) + ": " + compact_json(v, inner)
             for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"


def tensor_entry(t):
    return {
        "dtype": str(t.dtype).replace("torch.", ""),
        "shape": list(t.shape),
        "values": tensor_to_json(t),
        "has_nonfinite": bool((~torch.isfinite(t)).any().item()),
    }


def module_outputs(model, args):
    """Run `model(*args)` in eager mode and record every module's output.

    Returns a list of (path, output) in the order the forward hooks fired,
    i.e. the order the modules finished executing.  Container modules that
    are never called (ModuleList) do not appear.
    """
    names = {mod: name for name, mod in model.named_modules()}
    fired = []

    def hook(mod, inputs, output):
        fired.append((names[mod], output.detach().clone()))

    handles = [mod.register_forward_hook(hook) for mod in names]
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return fired


def nonfinite_kind(t):
    """"finite", "inf", "nan" or "inf+nan" depending on what `t` holds."""
    has_inf = bool(torch.isinf(t).any().item())
    has_nan = bool(torch.isnan(t).any().item())
    if has_inf and has_nan:
        return "inf+nan"
    return "inf" if has_inf else "nan" if has_nan else "finite"


def first_nonfinite(fired):
    """First non-root module (in execution order) whose output is not finite."""
    for path, out in fired:
        if path != "" and not torch.isfinite(out).all():
            return path
    return None


# ---------------------------------------------------------------------------
# Fixture generation
# ---------------------------------------------------------------------------


def make_mlp():
    torch.manual_seed(0)
    model = TinyMLP().eval()
    return model


def clean_batch(gen):
    """A (2, 4) float32 batch with modest values in [-1, 1)."""
    return torch.rand(2, 4, generator=gen, dtype=torch.float32) * 2 - 1


def overflow_batch(model):
    """A finite (2, 4) input whose forward overflows to inf inside fc1.

    Row 0 of the batch is chosen for fc1's output unit j with the largest
    sum_i |W[j, i]|: every input element is 3.4e38 with the sign of W[j, i], so
    fc1's pre-activation for unit j is sum_i |W[j, i]| * 3.4e38 + b[j], which
    exceeds the float32 maximum (~3.4028e38) and rounds to +inf.  The input
    itself is finite (3.4e38 < float32 max).  Row 1 is an ordinary row.
    """
    w = model.fc1.weight.detach()
    j = int(w.abs().sum(dim=1).argmax().item())
    assert w[j].abs().sum().item() * 3.4e38 > 3.5e38, "weights too small to overflow"
    row0 = torch.sign(w[j]) * 3.4e38
    row1 = torch.tensor([0.25, -0.5, 0.75, -1.0])
    batch = torch.stack([row0, row1]).to(torch.float32)
    assert torch.isfinite(batch).all()
    return batch


def main():
    # TorchScript serializes module constants (e.g. Linear's in_features and
    # out_features) in set order, which depends on Python's string hash
    # seed.  Re-run with a fixed seed so the archives are byte-identical.
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)

    print("torch", torch.__version__)

    # -- TinyMLP ------------------------------------------------------------
    mlp = make_mlp()
    mlp_scripted = torch.jit.script(mlp)
    torch.jit.save(mlp_scripted, out_path("mlp_scripted.pt"))

    gen = torch.Generator().manual_seed(1234)
    clean = [clean_batch(gen) for _ in range(3)]
    torch.save(clean, out_path("mlp_inputs_clean.pt"))

    # Batches 0, 1 and 3 are clean.  Batch 2 is finite, but its first row
    # holds +/-3.4e38 values aligned with fc1's weights, so fc1's output
    # overflows to inf (see overflow_batch); the model produces the inf.
    overflow = [clean_batch(gen), clean_batch(gen), overflow_batch(mlp), clean_batch(gen)]
    torch.save(overflow, out_path("mlp_inputs_overflow.pt"))

    # Batch 0 is clean.  Batch 1's input already contains a NaN (element
    # [0, 2]), so the NaN is passed through the model rather than produced.
    nan_in = [clean_batch(gen), clean_batch(gen)]
    nan_in[1][0, 2] = float("nan")
    torch.save(nan_in, out_path("mlp_inputs_nan_input.pt"))

    # -- TwoInput -----------------------------------------------------------
    two = TwoInput().eval()
    torch.jit.save(torch.jit.script(two), out_path("two_input_scripted.pt"))
    two_pairs = [
        (torch.rand(3, generator=gen) * 2 - 1, torch.rand(3, generator=gen) * 2 - 1)
        for _ in range(2)
    ]
    # Each batch is a tuple (x, y) of positional arguments ...
    torch.save(two_pairs, out_path("two_input_batches.pt"))
    # ... or, equivalently, a list [x, y].
    torch.save([[x, y] for x, y in two_pairs], out_path("two_input_batches_list.pt"))

    # A list holding exactly one batch.  Python's pickler writes a
    # one-element list with the APPEND opcode (longer lists use APPENDS),
    # so this file exercises a different code path in any unpickler.
    single = [clean[0]]
    torch.save(single, out_path("mlp_inputs_single.pt"))

    # An empty list: a valid file with no batches.
    torch.save([], out_path("empty_list.pt"))

    # -- Error fixtures -----------------------------------------------------
    # A dict instead of a list of batches: valid file, wrong structure.
    # (A one-entry dict is pickled with the SETITEM opcode.)
    torch.save({"a": torch.ones(2)}, out_path("not_a_list.pt"))
    # A bare tensor instead of a list of batches: wrong structure again.
    torch.save(torch.ones(2), out_path("not_a_list_tensor.pt"))
    # A truncated archive: the first 40 bytes of a valid file.
    with open(out_path("mlp_inputs_clean.pt"), "rb") as f:
        head = f.read(40)
    with open(out_path("corrupt.pt"), "wb") as f:
        f.write(head)

    # -- Load everything back -----------------------------------------------
    mlp_loaded = torch.jit.load(out_path("mlp_scripted.pt"))
    two_loaded = torch.jit.load(out_path("two_input_scripted.pt"))
    for name in ("mlp_inputs_clean.pt", "mlp_inputs_overflow.pt",
                 "mlp_inputs_nan_input.pt", "two_input_batches.pt",
                 "two_input_batches_list.pt", "mlp_inputs_single.pt",
                 "empty_list.pt", "not_a_list.pt", "not_a_list_tensor.pt"):
        torch.load(out_path(name))
    try:
        torch.load(out_path("corrupt.pt"))
        raise SystemExit("corrupt.pt unexpectedly loaded")
    except SystemExit:
        raise
    except Exception as e:  # expected: truncated archive
        print("corrupt.pt fails to load as intended:", type(e).__name__)

    # -- Expected results ---------------------------------------------------
    mlp64 = make_mlp().double()

    def mlp_case(model_file, inputs_file, batches):
        entries = []
        for i, b in enumerate(batches):
            with torch.no_grad():
                out32 = mlp_loaded(b)
                out32_eager = mlp(b)
                out64 = mlp64(b.double())
            # The scripted and eager models must agree bit for bit
            # (NaN positions included).
            assert torch.equal(torch.isnan(out32), torch.isnan(out32_eager))
            assert torch.equal(torch.nan_to_num(out32), torch.nan_to_num(out32_eager))
            fired = module_outputs(mlp, (b,))
            entries.append({
                "index": i,
                "input": tensor_entry(b),
                "input_has_nonfinite": bool((~torch.isfinite(b)).any().item()),
                "fp32": tensor_entry(out32),
                "fp64": tensor_entry(out64),
                "first_nonfinite_module": first_nonfinite(fired),
                "module_outputs_kind": {
                    path: nonfinite_kind(out) for path, out in fired if path != ""
                },
            })
        return {"model": model_file, "inputs": inputs_file, "batches": entries}

    def two_case(inputs_file, pairs):
        entries = []
        for i, (x, y) in enumerate(pairs):
            with torch.no_grad():
                out32 = two_loaded(x, y)
                out64 = two(x.double(), y.double())
            entries.append({
                "index": i,
                "fp32": tensor_entry(out32),
                "fp64": tensor_entry(out64),
            })
        return {"model": "two_input_scripted.pt", "inputs": inputs_file,
                "batches": entries}

    def module_table(eager, scripted):
        rows = []
        scripted_mods = dict(scripted.named_modules())
        for path, mod in eager.named_modules():
            rows.append({
                "path": path,
                "class_name": type(mod).__name__,
                # The TorchScript type name, as C++ sees it through
                # module.type()->name()->qualifiedName().
                "scripted_qualified_name": scripted_mods[path]._c._type().qualified_name(),
            })
        return rows

    cases = [
        mlp_case("mlp_scripted.pt", "mlp_inputs_clean.pt", clean),
        mlp_case("mlp_scripted.pt", "mlp_inputs_overflow.pt", overflow),
        mlp_case("mlp_scripted.pt", "mlp_inputs_nan_input.pt", nan_in),
        mlp_case("mlp_scripted.pt", "mlp_inputs_single.pt", single),
        mlp_case("mlp_scripted.pt", "empty_list.pt", []),
        two_case("two_input_batches.pt", two_pairs),
        two_case("two_input_batches_list.pt", two_pairs),
    ]

    ovf = cases[1]["batches"][2]
    print("mlp_inputs_overflow batch 2: first module with a non-finite output:",
          ovf["first_nonfinite_module"])
    print("  per module:", ovf["module_outputs_kind"])
    assert not ovf["input_has_nonfinite"] and ovf["fp32"]["has_nonfinite"]
    assert not ovf["fp64"]["has_nonfinite"]
    assert ovf["first_nonfinite_module"] == "fc1"

    expected = {
        "generator": "tests/data/make_fixtures.py",
        "torch_version": torch.__version__,
        "notes": [
            "Non-finite numbers are encoded as the strings \"inf\", \"-inf\", \"nan\".",
            "fp32 values are exact: each parses back to the same float32 value.",
            "first_nonfinite_module is the first module, in execution order, "
            "whose output holds inf or nan (null if none).",
        ],
        "models": {
            "mlp_scripted.pt": {
                "modules": module_table(mlp, mlp_loaded),
            },
            "two_input_scripted.pt": {
                "modules": module_table(two, two_loaded),
            },
        },
        "cases": cases,
        "overflow": {
            "inputs": "mlp_inputs_overflow.pt",
            "batch": 2,
            "first_nonfinite_module": ovf["first_nonfinite_module"],
        },
        "nan_input": {
            "inputs": "mlp_inputs_nan_input.pt",
            "batch": 1,
            "input_element": [0, 2],
        },
        "wrong_structure": {
            "not_a_list.pt": "dict {'a': tensor of shape [2]}",
            "not_a_list_tensor.pt": "tensor of shape [2]",
            "corrupt.pt": "first 40 bytes of mlp_inputs_clean.pt (truncated zip)",
        },
    }
    with open(out_path("expected.json"), "w") as f:
        f.write(compact_json(expected) + "\n")

    for name in sorted(os.listdir(HERE)):
        print(f"{os.path.getsize(out_path(name)):8d}  {name}")


if __name__ == "__main__":
    main()
