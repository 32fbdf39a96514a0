"""An Accelerate loop on the sentinel with one line (overflow_sentinel.accelerate.watch_steps): on
the CPU, with gradient accumulation, prepare() and backward() work watched as unwatched, a step's
micro-batches are one batch, and a planted overflow stops the loop in its step."""

import os

import pytest
import torch
from torch import nn
from torch.nn import functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")
accelerate = pytest.importorskip("accelerate")

from overflow_sentinel import NonFiniteError  # noqa: E402
from overflow_sentinel.accelerate import watch_steps  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def loop(watched, steps=4, accumulation=2, plant_at=None):
    """Losses of `steps` optimizer steps of `accumulation` micro-batches each, the watchdog and the
    model (the watchdog lives as long as the model)."""
    torch.manual_seed(0)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(steps * accumulation * 2, 8)),
                                       batch_size=2)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    watch = watch_steps(accelerator, model, optimizer) if watched else None
    losses = []
    for i, (x,) in enumerate(data):
        if plant_at is not None and i == plant_at * accumulation:
            with torch.no_grad():
                accelerator.unwrap_model(model).fc1.weight.fill_(3e38)
        with accelerator.accumulate(model):
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses, watch, model


def test_an_accelerate_loop_trains_watched_as_unwatched_one_batch_per_optimizer_step():
    expected, _, _ = loop(watched=False)
    losses, watch, model = loop(watched=True)
    assert losses == expected
    assert watch.batch_number == 4 and watch.report is None  # 8 micro-batches, 4 steps
    watch.close()


def test_a_planted_overflow_stops_the_loop_in_its_step():
    with pytest.raises(NonFiniteError) as caught:
        loop(watched=True, plant_at=2)
    report = caught.value.report
    assert report.batch_number == 2 and report.trigger.module_path == "fc1"
