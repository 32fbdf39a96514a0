"""Writes the benchmarks' TorchScript model: the transformer of bench/transformer_model.h, the same
layers and sizes, scripted with torch.jit.script as users' models are (the CLI's path).

Usage: scripts/python.sh bench/make_bench_models.py OUT_DIR
"""
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn


class EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ff)
        self.fc2 = nn.Linear(ff, d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.ln1(x)
        q_k_v = self.qkv(h).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q_k_v[0], q_k_v[1].transpose(-2, -1)) / math.sqrt(float(d // self.heads))
        attn = torch.matmul(torch.softmax(scores, -1), q_k_v[2]).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(attn)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Encoder(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, ff: int):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(d, heads, ff) for _ in range(layers)])
        self.final_ln = nn.LayerNorm(d)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.final_ln(x)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    model = torch.jit.script(Encoder(6, 256, 4, 1024))
    # The scripted module must compute what the eager one does.
    x = torch.randn(4, 128, 256)
    eager = Encoder(6, 256, 4, 1024)
    eager.load_state_dict(model.state_dict())
    assert torch.allclose(model(x), eager(x), atol=1e-5)
    model.save(os.path.join(out_dir, "transformer_scripted.pt"))


if __name__ == "__main__":
    main()
