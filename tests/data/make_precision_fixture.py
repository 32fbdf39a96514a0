#!/usr/bin/env python3
"""Write the fixture of `sentinel diff`'s test: a model whose bfloat16 run parts from its
float32 run at a known op.

    h = tanh(fc1(x)); shifted = h + 4096; back = shifted - 4096; y = fc2(back)

In float32 `back` equals `h` to about 2e-4. In bfloat16 (8 significant bits) the numbers near
4096 are 32 apart, so `shifted` rounds to 4096 and `back` is 0: the traces agree up to aten::add
and part at aten::sub.

Usage (from the repository root): scripts/python.sh tests/data/make_precision_fixture.py
"""

import os

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))


class Cancellation(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        shifted = h + 4096.0
        back = shifted - 4096.0
        return self.fc2(back)


def main():
    torch.manual_seed(7)
    model = Cancellation().eval()
    scripted = torch.jit.script(model)
    torch.jit.save(scripted, os.path.join(HERE, "cancel_scripted.pt"))
    gen = torch.Generator().manual_seed(11)
    batches = [torch.randn(8, 16, generator=gen) for _ in range(2)]
    torch.save(batches, os.path.join(HERE, "cancel_inputs.pt"))

    # What the test relies on, checked here with Python's own bfloat16 kernels.
    with torch.no_grad():
        x = batches[0]
        h32 = torch.tanh(model.fc1(x))
        back32 = (h32 + 4096.0) - 4096.0
        m16 = Cancellation()
        m16.load_state_dict(model.state_dict())
        m16 = m16.to(torch.bfloat16)
        h16 = torch.tanh(m16.fc1(x.to(torch.bfloat16)))
        back16 = (h16 + 4096.0) - 4096.0
    assert back32.abs().max() > 0.5, back32.abs().max()
    assert back16.abs().max() == 0, back16.abs().max()
    assert ((h16.float() - h32).abs().max() / h32.abs().max()) < 0.02
    print("float32 back abs max", float(back32.abs().max()), "bfloat16:", float(back16.abs().max()))


if __name__ == "__main__":
    main()
