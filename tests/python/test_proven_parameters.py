"""The parameters an optimizer's step wrote, proven finite instead of read (docs/nonfinite.md, "An
optimizer's states, bounded"): watched at module boundaries, a step whose states and parameters
are proven reads nothing, and a module's frame shows its parameters read when a report is made
(what torch finds in them then), or says they were written since."""

import math

import pytest
import torch
from torch import nn

import overflow_sentinel
from overflow_sentinel import NonFiniteError


def trained(optimizer_of, steps, **options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = optimizer_of(model.parameters())
    w = overflow_sentinel.watch_steps(model, optimizer, exact=False, max_frames_to_save=500, **options)
    for _ in range(steps):
        model(torch.randn(4, 6)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer, w


def parameter_entries(frame):
    return {e.label: e for e in frame.entries if e.role == "parameter"}


@pytest.mark.parametrize("optimizer_of", [lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                                          lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
                                          lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9)],
                         ids=["adamw", "adamw_fused", "sgd_momentum"])
def test_a_proven_step_reads_nothing_and_a_report_shows_the_parameters_as_torch_finds_them(optimizer_of):
    model, optimizer, w = trained(optimizer_of, steps=3)
    try:
        assert w._state_bounds[0].proven_parameters.keys() == {0}
        # Aligned with the first row of the first Linear's weight: that row's output overflows.
        x = model[0].weight[0].detach().sign().expand(4, 6) * 3.4e38
        with pytest.raises(NonFiniteError) as caught:
            model(x)
            optimizer.step()  # (a step's forward's error is raised before its optimizer step)
    finally:
        w.close()
    report = caught.value.report
    # What the steps read: the first one's states and parameters (its states were made there);
    # the next two were proven, and read nothing.
    read_by_steps = sorted({f.batch_number for f in report.frames if f.op == "optimizer.step"})
    assert read_by_steps == [0]
    assert report.trigger.module_path == "0"
    shown = parameter_entries(report.trigger)
    assert shown.keys() == {"weight", "bias"}
    for name, entry in shown.items():
        p = getattr(model[0], name).detach()
        assert entry.kind == "tensor"
        assert (entry.stats.abs_min, entry.stats.abs_max) == (p.abs().min().item(), p.abs().max().item())
        assert entry.stats.count == p.numel() and entry.stats.nan + entry.stats.pos_inf + entry.stats.neg_inf == 0


def test_a_parameter_written_after_its_frame_is_said_written_since_not_shown_as_it_is_now():
    model, optimizer, w = trained(lambda ps: torch.optim.AdamW(ps, lr=1e-3), steps=3)
    try:
        assert w._state_bounds[0].proven_parameters.keys() == {0}
        loss = model(torch.randn(4, 6)).sum() * 3e38
        with torch.no_grad():
            model[0].weight.mul_(2)  # after its frame was made, before the report
        with pytest.raises(NonFiniteError) as caught:
            loss.backward()  # the last Linear's weight's gradient overflows
            optimizer.step()  # (where the backward's error is raised)
    finally:
        w.close()
    report = caught.value.report
    assert report.trigger.direction == "backward"
    forward = [f for f in report.frames if f.batch_number == report.batch_number and f.module_path == "0"
               and f.op == "forward"]
    assert forward
    shown = parameter_entries(forward[-1])
    assert shown["weight"].kind == "skipped" and shown["weight"].skip_reason == "proven finite, not read; written since"
    bias = model[0].bias.detach()
    assert shown["bias"].kind == "tensor" and shown["bias"].stats.abs_max == bias.abs().max().item()


def test_a_step_that_could_overflow_a_parameter_reads_it_and_names_the_inf():
    """lr large enough that one step overflows: no proof, the step's parameters are read, and the
    inf is named at the step, by tensor and element."""
    model, optimizer, w = trained(lambda ps: torch.optim.SGD(ps, lr=1e-2), steps=2)
    try:
        assert w._state_bounds[0].proven_parameters.keys() == {0}
        optimizer.param_groups[0]["lr"] = 3e38
        model(torch.randn(4, 6)).pow(2).mean().mul(1e3).backward()
        with pytest.raises(NonFiniteError) as caught:
            optimizer.step()
    finally:
        w.close()
    report = caught.value.report
    assert report.trigger.op == "optimizer.step" and w._state_bounds[0].proven_parameters == {}
    name, index = report.first_nonfinite["tensor"], report.first_nonfinite["index"]
    assert math.isinf(dict(model.named_parameters())[name].detach()[index].item())
