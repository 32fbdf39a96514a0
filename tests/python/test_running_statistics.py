"""Batch norm's running statistics, updated in place while training, though the schema of
`aten::batch_norm` does not mark them written: an inf the update writes into `running_var` is
caught at that op, named, although the op's result stays finite; in eval mode they are only read."""

import pytest
import torch
from torch import nn

from overflow_sentinel import NonFiniteError, Watch
from tiers import both_tiers, named

# Two samples of one channel, finite in float32: the batch's output stays finite, but the unbiased
# variance that the update blends into running_var overflows float32 (the first test asks torch).
HUGE = torch.tensor([[5e19], [-5e19]])


def norm():
    return nn.Sequential(nn.Linear(1, 1), nn.BatchNorm1d(1))


def through_identity(model):
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[0].bias.zero_()
    return model


def test_the_update_overflowing_running_var_is_what_torch_computes():
    # The oracle: torch, unwatched, on the same inputs.
    model = through_identity(norm()).train()
    out = model(HUGE)
    assert torch.isfinite(out).all()
    assert torch.isinf(model[1].running_var).all()
    assert torch.isfinite(model[1].running_mean).all()


@both_tiers
def test_an_inf_written_into_running_var_while_training_is_named_at_batch_norm(tier):
    model = through_identity(norm()).train()
    w = Watch(model, max_frames_to_save=10)
    x = torch.ones(2, 1)
    x[1] = -1.0
    with pytest.raises(NonFiniteError) as caught:
        for inputs in [x, x, HUGE, x]:
            with w.batch():
                model(inputs)
    if tier == "boundary":
        # What the boundaries saw: the module's forward, whose buffer now holds an inf (read after
        # it, as HF's frames do not); the replay names the op.
        seen = caught.value.report.trigger
        assert (seen.op, seen.module_path) == ("forward", "1")
        assert [e.label for e in seen.entries if e.stats.pos_inf or e.stats.nan] == ["running_var"]
        assert caught.value.replay.reproduced
    report = named(caught.value)
    assert report.batch_number == 2
    assert report.trigger.op == "aten::batch_norm"
    nonfinite = [e.label for e in report.trigger.entries if e.stats.pos_inf or e.stats.nan or e.stats.neg_inf]
    assert any("running_var" in label for label in nonfinite), [e.label for e in report.trigger.entries]
    assert not any("running_mean" in label for label in nonfinite)
    assert report.escape == "written"  # into the module's buffer, which outlives the forward
    assert all(torch.isfinite(p).all() for p in model.parameters())
    w.close()


def test_in_eval_mode_the_running_statistics_are_not_read_as_written():
    model = through_identity(norm())
    model.train()
    model(torch.tensor([[1.0], [-1.0]]))  # running statistics that are not the defaults
    model.eval()
    w = Watch(model, max_frames_to_save=10, exact=True)  # (op frames)
    with w.batch():
        model(torch.tensor([[0.5], [2.0]]))
    frames = [f for f in w.saved_frames() if f.op == "aten::batch_norm"]
    assert frames, [f.op for f in w.saved_frames()]
    written = [e.label for e in frames[-1].entries if e.role == "output" and "running" in e.label]
    assert written == [], [e.label for e in frames[-1].entries]
    w.close()


def test_a_read_of_the_running_statistics_later_in_the_batch_shows_their_new_values():
    # batch_norm reads running_var at its start and updates it without counting a version: an op
    # reading it later in the same batch must be shown the new numbers, not that first read's.
    model = through_identity(norm()).train()
    w = Watch(model, max_frames_to_save=20, exact=True)  # (op frames)
    with w.batch():
        model(torch.tensor([[3.0], [-3.0]]))
        model[1].running_var.mul(2.0)
    new = model[1].running_var.item()
    assert new != 1.0  # torch's update: 0.9 * 1 + 0.1 * 18
    reads = [f for f in w.saved_frames() if f.op == "aten::mul"]
    assert reads, [f.op for f in w.saved_frames()]
    assert reads[-1].entries[0].stats.abs_max == pytest.approx(new, rel=1e-6)
    w.close()
