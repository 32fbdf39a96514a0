"""Small eager models for the Python module's tests: a T5-style stack whose gated feed-forward can
be made to overflow in the `mul` between its two sub-modules, and a head whose backward makes inf."""

import torch
from torch import nn


class T5LayerNorm(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + 1e-6))


class T5DenseGatedGeluDense(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.wi_0 = nn.Linear(d_model, d_ff, bias=False)
        self.wi_1 = nn.Linear(d_model, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d_model, bias=False)
        self.act = nn.GELU()

    def forward(self, hidden_states):
        hidden_gelu = self.act(self.wi_0(hidden_states))
        hidden_linear = self.wi_1(hidden_states)
        hidden_states = hidden_gelu * hidden_linear  # OVERFLOW_LINE
        return self.wo(hidden_states)  # LEAVES_LINE


class T5LayerFF(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.layer_norm = T5LayerNorm(d_model)
        self.DenseReluDense = T5DenseGatedGeluDense(d_model, d_ff)

    def forward(self, hidden_states):
        forwarded = self.DenseReluDense(self.layer_norm(hidden_states))
        return hidden_states + forwarded


class T5Block(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.layer = nn.ModuleList([T5LayerFF(d_model, d_ff)])

    def forward(self, hidden_states):
        for layer in self.layer:
            hidden_states = layer(hidden_states)
        return hidden_states


class TinyT5(nn.Module):
    def __init__(self, d_model=8, d_ff=16, blocks=2):
        super().__init__()
        self.block = nn.ModuleList([T5Block(d_model, d_ff) for _ in range(blocks)])
        self.head = nn.Linear(d_model, 4)

    def forward(self, hidden_states):
        for block in self.block:
            hidden_states = block(hidden_states)
        return self.head(hidden_states)


def tiny_t5(seed=0, **kwargs):
    torch.manual_seed(seed)
    return TinyT5(**kwargs)


def plant_overflow(model, block=1):
    """Weights that make the gated feed-forward of `block` overflow in its mul: with an input of
    ones the layer norm gives ones, each projection 8e19 (finite), their product 6.4e39 (inf)."""
    ff = model.block[block].layer[0].DenseReluDense
    with torch.no_grad():
        ff.wi_0.weight.fill_(1e19)
        ff.wi_1.weight.fill_(1e19)


class SqrtHead(nn.Module):
    """relu gives 0 everywhere (bias -100): sqrt's gradient there is inf."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        with torch.no_grad():
            self.lin.weight.fill_(0.1)
            self.lin.bias.fill_(-100.0)

    def forward(self, x):
        return torch.sqrt(torch.relu(self.lin(x)))


class SqrtOfZero(nn.Module):
    """sqrt of a linear layer's zeros: finite forward, the gradient into the layer inf (it reaches
    the layer's weights)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        with torch.no_grad():
            self.lin.weight.zero_()
            self.lin.bias.zero_()

    def forward(self, x):
        return torch.sqrt(self.lin(x * 1.0))  # (x itself is not kept for the backward)


class Mlp(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def line_of(marker):
    """The number of the line of this file that holds `marker`."""
    with open(__file__) as source:
        for number, line in enumerate(source, 1):
            if marker in line and "line_of" not in line:
                return number
    raise AssertionError(marker)
