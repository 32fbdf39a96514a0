"""A small T5-style model trained in Python eager code, watched by Overflow Sentinel.

    scripts/python.sh examples/python/train_t5_style.py [--steps N] [--lr LR]

With the default learning rate the run is clean. With a learning rate that is far too large
(--lr 5e5, say) the weights grow until the gated feed-forward's `mul` overflows: the watchdog prints
the report (the op, its module, the Python line, what its inputs held) and raises
overflow_sentinel.NonFiniteError, a ValueError, before the optimizer can write inf into the
weights. Exit status: 0 clean, 3 stopped at an inf/nan.
"""

import argparse
import sys

import torch
from torch import nn

from overflow_sentinel import DebugUnderflowOverflow, NonFiniteError


class GatedFeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.wi_0 = nn.Linear(d_model, d_ff, bias=False)
        self.wi_1 = nn.Linear(d_model, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.wo(nn.functional.gelu(self.wi_0(x)) * self.wi_1(x))


class Block(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.ff = GatedFeedForward(d_model, d_ff)

    def forward(self, x):
        return x + self.ff(self.norm(x))


class TinyT5(nn.Module):
    def __init__(self, d_model=64, d_ff=256, layers=4, vocab=100):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList([Block(d_model, d_ff) for _ in range(layers)])
        self.lm_head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--report-dir", default=None, help="also write the report as .txt, .json and .html")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyT5()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    # The one line that differs from Hugging Face's debugging recipe.
    debug = DebugUnderflowOverflow(model, report_dir=args.report_dir)
    try:
        for step in range(args.steps):
            tokens = torch.randint(0, 100, (8, 32))
            logits = model(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {step}: loss {loss.item():.4f}")
    except NonFiniteError as error:
        trigger = error.report.trigger
        print(f"stopped at batch {error.report.batch_number}: {trigger.module_path} {trigger.op} "
              f"({trigger.direction}); {error.report.origin}", file=sys.stderr)
        return 3
    finally:
        debug.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
