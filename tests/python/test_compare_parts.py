"""The parts of overflow_sentinel.compare that need no model: transform pipelines against the
same steps written in torch, the MX casts against their definition (OCP MX v1.0) computed
element by element in float64, and the tolerance rule."""

import math

import pytest
import torch

from overflow_sentinel.compare import FLOOR, MULTIPLE, Tolerance, Transform, mx_cast
from overflow_sentinel.compare.tolerance import error, metrics


def test_a_pipeline_reshapes_heads_as_torch_does():
    # Megatron's interleaved QKV: per head, its q, k and v rows in turn.
    heads, head_dim, hidden = 4, 16, 64
    q, k, v = (torch.randn(heads * head_dim, hidden) for _ in range(3))
    interleaved = torch.stack([q, k, v]).reshape(3, heads, head_dim, hidden).transpose(0, 1).reshape(-1, hidden)
    t = Transform("cat(0)|reshape(3,4,16,-1)|transpose(0,1)|reshape(-1,64)", "test")
    assert torch.equal(t([q, k, v]), interleaved)
    assert torch.equal(Transform("permute(1,0,2)", "test")([torch.ones(2, 3, 4)]), torch.ones(3, 2, 4))
    assert torch.equal(Transform("chunk(3,0,1)", "test")([interleaved]), interleaved.chunk(3, 0)[1])
    assert torch.equal(Transform("sum", "test")([q, k, v]), q + k + v)


def test_a_pipeline_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match=r"transform step 'rotate\(1\)' is not one of"):
        Transform("cat(0)|rotate(1)", "a rule")
    with pytest.raises(ValueError, match=r"takes whole numbers"):
        Transform("cat(x)", "a rule")
    with pytest.raises(ValueError, match=r"leaves 2 tensors"):
        Transform("transpose(0,1)", "a rule")([torch.ones(2, 2), torch.ones(2, 2)])


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _nearest_even(value, grid, significand_even):
    """value rounded to the nearest grid point, ties to the one with an even significand."""
    best = min(grid, key=lambda g: (abs(g - value), not significand_even(g)))
    return best


def _e2m1_even(g):
    # E2M1 significands: 0.5 (subnormal, odd), 1, 2, 4 (even), 1.5, 3, 6 (odd); 0 is even.
    return g in (0.0, 1.0, 2.0, 4.0)


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp8_e5m2", "mxfp4"])
def test_mx_casts_follow_their_definition(recipe):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 96, generator=generator, dtype=torch.float32) * torch.logspace(-3, 3, 96)
    x[0, :32] = 0                                # a block of zeros keeps scale 1
    x[1, 5] = 1e30                               # one block dominated by a huge value
    cast = mx_cast(x, recipe)
    emax = {"mxfp8": 8, "mxfp8_e5m2": 15, "mxfp4": 2}[recipe]
    for row in range(4):
        for block in range(3):
            values = x[row, block * 32:(block + 1) * 32].double()
            amax = float(values.abs().max())
            scale = 2.0 ** (math.floor(math.log2(amax)) - emax) if amax > 0 else 1.0
            got = cast[row, block * 32:(block + 1) * 32].double()
            for v, g in zip(values.tolist(), got.tolist()):
                scaled = v / scale
                if recipe == "mxfp4":
                    want = math.copysign(_nearest_even(min(abs(scaled), 6.0), E2M1, _e2m1_even), scaled) * scale
                else:
                    dtype = torch.float8_e4m3fn if recipe == "mxfp8" else torch.float8_e5m2
                    largest = 448.0 if recipe == "mxfp8" else 57344.0
                    want = float(torch.tensor(max(-largest, min(largest, scaled))).to(dtype).double()) * scale
                assert g == pytest.approx(want, rel=0, abs=0), (row, block, v, g, want)


def test_the_tolerance_is_the_baselines_error_times_m_never_below_the_floor():
    t = Tolerance("bfloat16")
    assert t.of(1e-2) == MULTIPLE["bfloat16"] * 1e-2
    assert t.of(0.0) == MULTIPLE["bfloat16"] * FLOOR["bfloat16"]
    assert Tolerance("e4m3").range_relative and not t.range_relative
    assert Tolerance("float32", multiple=3, floor=1e-5).of(1e-9) == pytest.approx(3e-5)
    with pytest.raises(ValueError, match=r"no tolerance for format 'fp6'"):
        Tolerance("fp6")


def test_the_metrics_against_float64():
    reference = torch.tensor([1.0, -2.0, 3.0, 0.0], dtype=torch.float64)
    value = torch.tensor([1.0, -2.5, 3.0, 0.0])
    rms = math.sqrt((1 + 4 + 9) / 4)
    assert error(value, reference) == pytest.approx(math.sqrt(0.25 / 4) / rms)
    m = metrics(value, reference, tolerance=0.1)
    assert m["max_abs"] == 0.5 and m["worst"] == {"index": [1], "candidate": -2.5, "reference": -2.0}
    assert m["within"] == 0.75 and m["max_rel"] == pytest.approx(0.25)
    assert m["cosine"] == pytest.approx(float(torch.nn.functional.cosine_similarity(value.double(), reference, dim=0)))
    assert error(torch.tensor([math.nan]), torch.tensor([1.0], dtype=torch.float64)) == math.inf
