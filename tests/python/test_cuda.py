"""The Python module on CUDA tensors: the same trips as on the CPU, read on the GPU (deferred, one
host wait per batch) and reported alike. Every test skips without a GPU; the backward trip runs on
both devices in test_hf_dropin.py."""

import pytest
import torch

from overflow_sentinel import DebugUnderflowOverflow, NonFiniteError

from models import plant_overflow, tiny_t5

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def forward_trip(device):
    """The planted overflow of the T5-style stack on `device`: the report of batch 1."""
    model = tiny_t5().to(device)
    debug = DebugUnderflowOverflow(model)
    model(torch.ones(2, 8, device=device))  # batch 0: clean
    plant_overflow(model, block=1)
    with pytest.raises(NonFiniteError) as caught:
        model(torch.ones(2, 8, device=device))
    debug.close()
    return caught.value.report


def test_a_forward_overflow_on_cuda_is_reported_as_on_the_cpu():
    on_gpu, on_cpu = forward_trip("cuda"), forward_trip("cpu")
    assert on_gpu.batch_number == on_cpu.batch_number == 1
    # Both name the mul that made the inf (the place rule, docs/nonfinite.md).
    for report in (on_gpu, on_cpu):
        made = report.origin_frame
        assert (made.op, made.module_path) == ("aten::mul", "block.1.layer.0.DenseReluDense")
        assert "aten::mul in block.1.layer.0.DenseReluDense" in report.origin
    # The CPU stops where the inf leaves wo, at its return. Frames that wait for the GPU's numbers
    # are judged when they are read back, after wo's return was: there the report stops where the
    # next module reads the value, the residual add of the layer around it.
    assert (on_cpu.trigger.op, on_cpu.trigger.module_path) == ("return", "block.1.layer.0.DenseReluDense.wo")
    assert (on_gpu.trigger.op, on_gpu.trigger.module_path) == ("aten::add", "block.1.layer.0")
    assert on_gpu.deferred and not on_cpu.deferred
    # The mul's entries read on the GPU equal the CPU's, element counts and infinities alike.
    gpu_entries = [(e.role, e.stats.count, e.stats.pos_inf, e.stats.nan) for e in on_gpu.origin_frame.entries]
    cpu_entries = [(e.role, e.stats.count, e.stats.pos_inf, e.stats.nan) for e in on_cpu.origin_frame.entries]
    assert gpu_entries == cpu_entries
    assert [e for e in on_gpu.origin_frame.entries if e.role == "output"][0].stats.pos_inf > 0


def test_watching_a_cuda_model_never_changes_its_results():
    model = tiny_t5().cuda()
    x = torch.randn(4, 8, device="cuda")
    unwatched = model(x)
    debug = DebugUnderflowOverflow(model)
    for _ in range(3):
        watched = model(x)
        assert torch.equal(watched, unwatched)
    assert debug.batch_number == 3 and debug.report is None
    debug.close()


def test_the_recipes_run_on_cuda_operands_without_a_stop():
    model = tiny_t5().cuda()
    debug = DebugUnderflowOverflow(model, fp8={"enabled": True, "recipes": ["delayed", "current", "mxfp8", "nvfp4",
                                                                           "float8block"]})
    for _ in range(2):
        model(torch.randn(4, 8, device="cuda")).sum().backward()
    assert debug.report is None
    debug.close()
