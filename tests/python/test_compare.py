"""overflow_sentinel.compare on transformers' Llama (small config, random weights, no hub) against
a port written as ports are (tests/python/llama_port.py: fused QKV, fused gate/up, [seq, batch,
hidden]): the faithful port agrees at every dtype, in bfloat16 against float32, compiled and under
an MXFP8 recipe; each planted bug is first shown with torch alone to move its module's result by
at least 10 times the tolerance, then compare must name that module, forward or backward. The
oracle is always a float64 run; no output is written down."""

import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

import llama_port as lp  # noqa: E402
from llama_port import one_thread, reference  # noqa: E402,F401 - the fixtures the tests share

import overflow_sentinel  # noqa: E402
from overflow_sentinel.compare import FLOOR, MULTIPLE, apply_recipe  # noqa: E402


def ids(seq, batch=2, seed=1):
    return torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(seed))


def run(reference, port, tokens, **kw):
    return overflow_sentinel.compare(reference, port, {"input_ids": tokens}, lp.MAPPING, candidate_inputs=(tokens,),
                                     activation=lp.ACTIVATION, **kw)


def rel_rmse(value, reference):
    value, reference = value.detach().double(), reference.detach().double()
    return float((value - reference).pow(2).mean().sqrt() / reference.pow(2).mean().sqrt())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_faithful_port_agrees_at_every_dtype(dtype):
    reference = lp.in_dtype(lp.llama(), dtype)
    result = run(reference, lp.port_of(reference, dtype=dtype), ids(16))
    assert result.agree, result.text
    assert result.verdict.startswith("agree:")
    assert result.tolerance.format == str(dtype).replace("torch.", "")
    # Every module of the port is compared, the fused ones against the groups they stand for.
    compared = {r["candidate"] for r in result.rows}
    assert "model.layers.1.attention.qkv" in compared and "model.layers.0.mlp.gate_up" in compared
    assert len(compared) == 23
    qkv = next(p for p in result.pairs if p.candidate == "model.layers.0.attention.qkv")
    assert qkv.reference == [f"model.layers.0.self_attn.{x}_proj" for x in "qkv"]
    assert all("gout" in r["backward"] for r in result.rows if r["candidate"] != "(root)")
    assert "model.rotary_emb" in result.only_reference
    assert result.weights_checked == 15


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_low_precision_port_agrees_with_its_float32_reference(reference, dtype):
    result = run(reference, lp.port_of(reference, dtype=dtype), ids(16))
    assert result.agree, result.text
    # The tolerance is the low precision's: the baseline is the reference run in it.
    assert result.tolerance.format == str(dtype).replace("torch.", "")
    worst = max(r["forward"]["out"]["error"] for r in result.rows)
    assert worst > 100 * FLOOR["float32"]     # the port's own rounding is there, and forgiven


def test_a_port_under_autocast_is_judged_in_autocasts_precision(reference):
    result = run(reference, lp.port_of(reference), ids(16), autocast=torch.bfloat16)
    assert result.agree, result.text
    assert result.tolerance.format == "bfloat16" and result.precision["autocast"] == "bfloat16"
    bugs = lambda i: ("transposed_o_proj",) if i == 1 else ()  # noqa: E731
    buggy = run(reference, lp.port_of(reference, bugs), ids(16), autocast=torch.bfloat16)
    assert buggy.first["candidate"] == "model.layers.1.attention.o_proj"


def test_a_compiled_port_is_compared_at_its_compiled_regions_and_agrees(reference):
    import torch._dynamo
    port = lp.port_of(reference)
    for i, layer in enumerate(port.model.layers):
        port.model.layers[i] = torch.compile(layer)
    torch._dynamo.utils.counters.clear()
    result = run(reference, port, ids(16))
    assert result.agree, result.text
    compared = [r["candidate"] for r in result.rows]
    assert "model.layers.0" in compared and "model.layers.0.attention" not in compared
    assert result.compiled["boundaries"] == ["model.layers.0", "model.layers.1"]
    assert any("fallback_random" in f for f in result.findings)
    # No hook inside a compiled region: Dynamo traces the layers as they are, without a break.
    assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.parametrize("recipe,fmt", [("mxfp8", "e4m3"), ("mxfp4", "fp4")])
def test_a_block_scaled_port_is_judged_by_its_recipes_tolerance(recipe, fmt):
    reference = lp.in_dtype(lp.llama(), torch.bfloat16)
    port = apply_recipe(lp.port_of(reference, dtype=torch.bfloat16), recipe)
    result = run(reference, port, ids(32), recipe=recipe)
    assert result.agree, result.text
    assert result.tolerance.format == fmt and result.tolerance.metric == "range-relative RMSE"
    # Judged as a plain bfloat16 port, the casts' own error is a divergence at the first cast GEMM.
    plain = run(reference, port, ids(32))
    assert not plain.agree and plain.first["candidate"] == "model.layers.0.attention.qkv"


def test_rope_angles_in_bfloat16_from_position_512_leave_shorter_sequences_alone(reference):
    assert run(reference, lp.port_of(reference, lambda i: ("rope_bf16",)), ids(16)).agree


# The planted bugs: (name, the layers that have it, sequence length, the module compare must name,
# the direction).
BUGS = [
    ("rope_offset", lambda i: ("rope_offset",), 16, "model.layers.0.attention", "forward"),
    ("rope_bf16", lambda i: ("rope_bf16",), 600, "model.layers.0.attention", "forward"),
    ("transposed_o_proj", lambda i: ("transposed_o_proj",) if i == 1 else (), 16,
     "model.layers.1.attention.o_proj", "forward"),
    ("detached_residual", lambda i: ("detached_residual",) if i == 1 else (), 16, "model.layers.1", "backward"),
    ("detached_norm_weight", lambda i: ("detached_norm_weight",) if i == 0 else (), 16,
     "model.layers.0.input_layernorm", "backward"),
]


def _captured_call(model, module, tokens):
    """The arguments `module` is called with when `model` runs on `tokens`."""
    seen = {}
    handle = module.register_forward_pre_hook(lambda m, a, k: seen.update(args=a, kwargs=k), with_kwargs=True)
    with torch.no_grad():
        model(input_ids=tokens)
    handle.remove()
    return seen["args"], seen["kwargs"]


def _to(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, tuple):
        return tuple(_to(v, dtype) for v in value)
    return value


def _bug_with_torch_alone(reference, name, bugs, seq, module_path, direction):
    """The bug's effect on its module's result (output; input or weight gradient for a backward bug) with
    torch alone: the reference's module on an input in float64 (the oracle) and in float32 (the
    baseline, which sets the tolerance) against the buggy port's module on the same input.
    Returns (error, tolerance)."""
    tokens = ids(seq, batch=1 if seq > 100 else 2)
    ref_path = {"model.layers.0.attention": "model.layers.0.self_attn",
                "model.layers.1.attention.o_proj": "model.layers.1.self_attn.o_proj"}.get(module_path, module_path)
    ref_module = dict(reference.named_modules())[ref_path]
    args, kwargs = _captured_call(reference, ref_module, tokens)
    x = kwargs.get("hidden_states", args[0] if args else None)
    rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
    oracle_module = copy.deepcopy(ref_module).double()
    port_module = dict(lp.port_of(reference, bugs).named_modules())[module_path]

    def result(module, x, rest, layout):
        x = x.detach().clone().requires_grad_(direction == "backward")
        out = module(x.transpose(0, 1) if layout else x, **rest)
        out = out[0] if isinstance(out, tuple) else out
        out = out.transpose(0, 1) if layout else out
        if direction == "forward":
            return out
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(out.dtype))
        if name == "detached_norm_weight":          # the bug is in the weight's gradient
            return module.weight.grad if module.weight.grad is not None else torch.zeros_like(module.weight)
        return x.grad

    rest64 = {k: _to(v, torch.float64) for k, v in rest.items()}
    exact = result(oracle_module, x.double(), rest64, False)
    baseline = result(copy.deepcopy(ref_module), x, rest, False)
    buggy = result(port_module, x, {}, module_path != "model.layers.1.attention.o_proj")
    tolerance = MULTIPLE["float32"] * max(rel_rmse(baseline, exact), FLOOR["float32"])
    return rel_rmse(buggy, exact), tolerance


@pytest.mark.parametrize("name,bugs,seq,module_path,direction", BUGS, ids=[b[0] for b in BUGS])
def test_a_planted_bug_is_named_at_its_module(reference, name, bugs, seq, module_path, direction):
    error, tolerance = _bug_with_torch_alone(reference, name, bugs, seq, module_path, direction)
    assert error >= 10 * tolerance, (name, error, tolerance)
    tokens = ids(seq, batch=1 if seq > 100 else 2)
    result = run(reference, lp.port_of(reference, bugs), tokens)
    assert not result.agree
    first = result.first
    assert (first["candidate"], first["direction"]) == (module_path, direction), result.text
    assert first["error"] > first["tolerance"] and first["input_error"] <= first["input_tolerance"]
    assert result.verdict.startswith(f"diverges: {direction} at {module_path} <-> ")
    if direction == "forward":
        # Fed the reference's input alone, the module makes the difference by itself.
        assert first["confirmation"]["ran"] and first["confirmation"]["reproduced"], first["confirmation"]
        assert first["worst"]["candidate"] != first["worst"]["reference"]
    else:
        # A backward bug leaves the forward equal everywhere.
        assert all(r["forward"]["out"]["error"] <= r["forward"]["out"]["tolerance"] for r in result.rows)
