#!/usr/bin/env python3
"""Write t5_ff_scripted.pt and t5_ff_inputs.pt: a T5-style gated feed-forward whose
`gelu(wi_0(x)) * wi_1(x)` TorchScript's fuser runs as one kernel, and five batches of which
batch 3 overflows float32 at that `mul` (both of its inputs are finite, about 1e20).

Usage (from the repository root): scripts/python.sh tests/data/make_fusion_fixture.py
Deterministic: fixed seed.
"""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


class T5DenseGatedActDense(nn.Module):
    def __init__(self, d_model=8, d_ff=16):
        super().__init__()
        self.wi_0 = nn.Linear(d_model, d_ff, bias=False)
        self.wi_1 = nn.Linear(d_model, d_ff, bias=False)
        self.dropout = nn.Dropout(0.1)
        self.wo = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        hidden_gelu = F.gelu(self.wi_0(x))
        hidden_linear = self.wi_1(x)
        hidden = hidden_gelu * hidden_linear
        hidden = self.dropout(hidden)
        return self.wo(hidden)


class TinyT5FF(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = T5DenseGatedActDense()

    def forward(self, x):
        return self.ff(x)


def main():
    torch.manual_seed(0)
    model = TinyT5FF().eval()
    torch.jit.save(torch.jit.script(model), os.path.join(HERE, "t5_ff_scripted.pt"))
    batches = [torch.rand(4, 8) * 2 - 1 for _ in range(5)]
    batches[3] = batches[3] * 1e20  # the linears stay finite; their product does not
    with torch.no_grad():
        for i, b in enumerate(batches):
            a, g = model.ff.wi_0(b), model.ff.wi_1(b)
            assert torch.isfinite(a).all() and torch.isfinite(g).all()
            assert torch.isfinite(F.gelu(a) * g).all() == (i != 3)
    torch.save(batches, os.path.join(HERE, "t5_ff_inputs.pt"))


if __name__ == "__main__":
    main()
