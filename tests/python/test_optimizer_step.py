"""The optimizer step watched inside a training step's batch: an inf that Adam writes into its
state is caught at that step, before the next forward, named by parameter and state tensor, with
its first element; an op of hundreds of tensors (`_foreach_*`) still shows the one that holds it."""

import pytest
import torch
from torch import nn

from overflow_sentinel import NonFiniteError, Watch
from tiers import both_tiers


def deep(layers=8):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(6, 6) for _ in range(layers)])


# torch.optim's three implementations, and the op of each that writes exp_avg_sq. The foreach and
# fused ops write their arguments in place and return nothing; the fused one does not even count
# a version.
IMPLEMENTATIONS = {
    "per_tensor": ({"foreach": False}, "aten::addcmul_"),
    "foreach": ({"foreach": True}, "aten::_foreach_addcmul_"),
    "fused": ({"fused": True}, "aten::_fused_adam_"),
}


@both_tiers
@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
def test_a_huge_gradient_that_makes_adams_exp_avg_sq_inf_is_named_with_parameter_and_element(implementation, tier):
    choice, writer = IMPLEMENTATIONS[implementation]
    model = deep()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **choice)
    w = Watch(model, max_frames_to_save=50)
    w.watch_optimizer(optimizer)
    x = torch.randn(4, 6)
    with pytest.raises(NonFiniteError) as caught:
        for step in range(4):
            with w.batch():
                model(x).pow(2).mean().backward()
                if step == 2:  # finite, but (1 - beta2) times its square overflows float32
                    model[7].weight.grad[3, 5] = 1e22
                optimizer.step()
                optimizer.zero_grad()
    report = caught.value.report
    assert report.batch_number == 2
    # The op that wrote it, not the next one to read it; at module boundaries, the step's read.
    assert report.trigger.op == (writer if tier == "exact" else "optimizer.step")
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the weights stay finite
    labels = [e.label for e in report.trigger.entries if e.stats.nan or e.stats.pos_inf or e.stats.neg_inf]
    assert "7.weight.exp_avg_sq" in labels, (report.trigger.op, [e.label for e in report.trigger.entries])
    assert report.first_nonfinite == {"tensor": "7.weight.exp_avg_sq", "index": (3, 5), "value": float("inf")}
    assert "7.weight.exp_avg_sq[3, 5] = inf" in str(caught.value)
    w.close()


def test_a_full_frame_keeps_the_non_finite_entry_over_finite_ones():
    model = deep(1)  # (the watchdog lives as long as its model)
    w = Watch(model, max_frames_to_save=10, exact=True)  # (an op of the loop's)
    tensors = [torch.ones(3) for _ in range(30)]
    tensors[25][1] = float("nan")
    with pytest.raises(NonFiniteError) as caught:
        with w.batch():
            torch._foreach_abs(tensors)
    trigger = caught.value.report.trigger
    assert trigger.entries_omitted > 0
    kept = [e.label for e in trigger.entries if e.stats.nan]
    assert "input[0][25]" in kept and "output[0][25]" in kept, [e.label for e in trigger.entries]
    w.close()


def test_reads_from_before_a_fused_step_are_not_taken_for_the_weights_new_values():
    # The fused step writes the weights without counting a version: a view of a weight read before
    # it, read again after it (the same memory, the same version), shows the new values.
    model = deep(1)
    optimizer = torch.optim.Adam(model.parameters(), lr=10.0, fused=True)
    w = Watch(model, max_frames_to_save=50, exact=True)  # (the step's op frames)
    w.watch_optimizer(optimizer)
    weight = model[0].weight
    with w.batch():
        model(torch.randn(4, 6)).sum().backward()
        version = weight._version
        torch.abs(weight[:2])
        optimizer.step()
        assert weight._version == version  # what makes this case: no version count
        torch.abs(weight[:2])
    before, after = [f.entries[0].stats.abs_max for f in w.saved_frames() if f.op == "aten::abs"]
    assert after == weight[:2].detach().abs().max().item() != before
    w.close()


def fused_adamw_step(params, grads, grad_scale=None):
    """torch's fused AdamW op itself, on fresh state, with AMP's gradient scale or without."""
    zeros = [torch.zeros_like(p) for p in params]
    steps = [torch.ones(()) for _ in params]  # torch.optim counts the step before the op
    torch._fused_adamw_(params, grads, zeros, [torch.zeros_like(p) for p in params], [], steps, lr=1e-3, beta1=0.9,
                        beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False, grad_scale=grad_scale)


def test_a_fused_optimizer_reads_its_gradients_again_only_when_it_unscales_them():
    # Its schema marks the gradients written; its kernels write them only to unscale them by the
    # gradient scale. Without one they are read once, as the op's inputs; with one, what the
    # unscaling writes into them is read and judged as the op's own write (a scale of 0: inf).
    model = deep(1)
    w = Watch(model, max_frames_to_save=50, exact=True)  # (the step's op frames)
    params = [torch.randn(4, 3) for _ in range(3)]
    grads = [torch.randn(4, 3) for _ in range(3)]
    with w.batch():
        fused_adamw_step(params, grads)
    frame = [f for f in w.saved_frames() if f.op == "aten::_fused_adamw_"][-1]
    written = [e.label for e in frame.entries if e.role == "output"]
    assert written and not any(label.startswith("grads") for label in written), written
    with pytest.raises(NonFiniteError) as caught:
        with w.batch():
            fused_adamw_step(params, grads, grad_scale=torch.tensor(0.0))
    trigger = caught.value.report.trigger
    assert trigger.op == "aten::_fused_adamw_"
    bad = [e for e in trigger.entries if e.stats.pos_inf + e.stats.neg_inf + e.stats.nan]
    inf_written = [e.label for e in bad if e.role == "output"]
    assert any(label.startswith("grads[") for label in inf_written), [e.label for e in trigger.entries]
    w.close()
