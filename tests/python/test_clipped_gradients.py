"""Clipping's multiply, proven instead of read (docs/nonfinite.md, "Clipping's multiply"): in the
training loop's window `_foreach_mul_` by clipping's coefficient (finite, at most 1) leaves finite
gradients finite and no larger, so they are not read again; a multiply that could grow them is read
and an inf it makes is found at it; a report shows the clipped gradients as torch finds them."""

import pytest
import torch
from torch import nn

import overflow_sentinel
from overflow_sentinel import NonFiniteError


def model_and_loss():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    return model, lambda: model(torch.randn(4, 6)).pow(2).mean()


def test_clipped_gradients_are_proven_not_read_again_and_the_states_stay_proven():
    model, loss_of = model_and_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    w = overflow_sentinel.watch_steps(model, optimizer, exact=False)
    grads = lambda: [p.grad for p in model.parameters()]  # noqa: E731
    try:
        for step in range(3):
            loss_of().backward()
            read = w._native.read_magnitude(grads())
            assert read == max(g.abs().max().item() for g in grads())  # read after the backward
            norm = nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            assert norm > 1e-3  # (the coefficient is below 1)
            known = w._native.read_magnitude(grads())
            clipped = max(g.abs().max().item() for g in grads())  # (ops the window watches: after)
            # Not read again (a read would know the clipped gradients' own largest magnitude), but
            # bounded: the magnitude read before, times the coefficient, rounded up.
            assert clipped < known <= read * (1e-3 / norm.item()) * (1 + 2**-6)
            optimizer.step()
            optimizer.zero_grad()
            if step > 0:
                assert w._state_bounds[0].why_read == "" and w._state_bounds[0].proven_parameters.keys() == {0}
    finally:
        w.close()


@pytest.mark.parametrize("exact", [False, True], ids=["boundary", "exact"])
def test_a_multiply_in_the_loop_that_overflows_is_found_at_it(exact):
    model, loss_of = model_and_loss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    w = overflow_sentinel.watch_steps(model, optimizer, exact=exact)
    try:
        with pytest.raises(NonFiniteError) as caught:
            loss_of().backward()
            for _ in range(2):  # (1e76: past float32's range)
                torch._foreach_mul_([p.grad for p in model.parameters()], torch.tensor(1e38))
            optimizer.step()
    finally:
        w.close()
    trigger = caught.value.report.trigger
    assert trigger.op == "aten::_foreach_mul_" and trigger.module_path == ""


def test_a_report_shows_the_clipped_gradients_as_torch_finds_them():
    model, loss_of = model_and_loss()
    # lr times the gradients overflows float32: no proof, the parameters are read, and are inf.
    optimizer = torch.optim.SGD(model.parameters(), lr=3e38)
    w = overflow_sentinel.watch_steps(model, optimizer, exact=False, max_frames_to_save=500)
    try:
        (loss_of() * 100).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1e6)  # (a coefficient of 1, multiplied all the same)
        with pytest.raises(NonFiniteError) as caught:
            optimizer.step()
    finally:
        w.close()
    report = caught.value.report
    assert report.trigger.op == "optimizer.step"
    clipping = [f for f in report.frames if f.op == "aten::_foreach_mul_"]
    assert len(clipping) == 1
    outputs = [e for e in clipping[0].entries if e.role == "output"]
    assert len(outputs) == 4  # each gradient, read as the report was made (SGD wrote none of them)
    for entry, p in zip(outputs, model.parameters()):
        assert entry.kind == "tensor" and entry.stats.abs_max == p.grad.abs().max().item()
        assert entry.stats.abs_min == p.grad.abs().min().item() and entry.stats.count == p.grad.numel()
