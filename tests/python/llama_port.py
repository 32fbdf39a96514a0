"""A port of transformers' Llama as ports are written: fused QKV, fused gate/up, activations laid
out [seq, batch, hidden]; with switches that plant the bugs ports really have. Its weights are
loaded from a LlamaForCausalLM through the same mapping the compare is given."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from overflow_sentinel.compare import Rule

# The port's names where they differ from transformers'; the rest match by path.
MAPPING = [
    Rule(r"model\.layers\.(\d+)\.attention\.qkv", r"model.layers.\1.self_attn.{q,k,v}_proj"),
    Rule(r"model\.layers\.(\d+)\.attention", r"model.layers.\1.self_attn", reference_class="LlamaAttention"),
    Rule(r"model\.layers\.(\d+)\.attention\.o_proj", r"model.layers.\1.self_attn.o_proj"),
    Rule(r"model\.layers\.(\d+)\.mlp\.gate_up", r"model.layers.\1.mlp.{gate,up}_proj"),
]
ACTIVATION = "transpose(0,1)"     # transformers' [batch, seq, ...] to the port's [seq, batch, ...]


def llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=128, positions=1024, seed=0):
    """A small LlamaForCausalLM with random weights (no hub)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         max_position_embeddings=positions, rms_norm_eps=1e-6, attn_implementation="sdpa",
                         use_cache=False)
    return LlamaForCausalLM(config).eval()


def in_dtype(model, dtype):
    """`model` with its parameters in `dtype` and its computed constants as made (what
    transformers does when it loads a model in a low precision: `inv_freq` stays float32)."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps, detached_weight=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps
        self.detached_weight = detached_weight

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        # The bug: the weight read detached, so it never trains; the forward's values are unchanged.
        return (self.weight.detach() if self.detached_weight else self.weight) * x.to(dtype)


class TransposedLinear(nn.Linear):
    """The bug: a square weight applied transposed. Its shape is right, so the weight check passes."""

    def forward(self, x):
        return F.linear(x, self.weight.t(), self.bias)


def rope_angles(positions, head_dim, theta, bf16_from=None):
    """[seq, head_dim/2] angles in float32, as transformers computes them; with `bf16_from`, the
    bug: positions from there on multiplied in bfloat16."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    angles = torch.outer(positions.float(), inv_freq)
    if bf16_from is not None:
        late = positions >= bf16_from
        wrong = torch.outer(positions.to(torch.bfloat16), inv_freq.to(torch.bfloat16)).float()
        angles = torch.where(late[:, None], wrong, angles)
    return angles


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config, bugs):
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // self.heads
        self.theta = config.rope_parameters["rope_theta"] if getattr(config, "rope_parameters", None) \
            else config.rope_theta
        self.qkv = nn.Linear(config.hidden_size, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=False)
        linear = TransposedLinear if "transposed_o_proj" in bugs else nn.Linear
        self.o_proj = linear(self.heads * self.head_dim, config.hidden_size, bias=False)
        self.bugs = bugs

    def rotate(self, t, positions, bf16_from):
        angles = rope_angles(positions, self.head_dim, self.theta, bf16_from)
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(t.dtype), emb.sin().to(t.dtype)
        return t * cos + rotate_half(t) * sin

    def forward(self, x):                                   # x: [seq, batch, hidden]
        seq, batch, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                     self.kv_heads * self.head_dim], dim=-1)
        q, k, v = (t.reshape(seq, batch, -1, self.head_dim).permute(1, 2, 0, 3) for t in (q, k, v))
        positions = torch.arange(seq, device=x.device)
        bf16_from = 512 if "rope_bf16" in self.bugs else None
        # The offset bug moves the queries one position against the keys (as a cache position off
        # by one does): moving both would cancel in the scores, which see only relative positions.
        q = self.rotate(q, positions + (1 if "rope_offset" in self.bugs else 0), bf16_from)
        k = self.rotate(k, positions, bf16_from)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(self.head_dim))
        return self.o_proj(out.permute(2, 0, 1, 3).reshape(seq, batch, -1))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config, bugs):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, "detached_norm_weight" in bugs)
        self.attention = Attention(config, bugs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)
        self.detach_residual = "detached_residual" in bugs

    def forward(self, x):
        # The bug: the residual branch cut from the graph; the forward's values are unchanged.
        residual = x.detach() if self.detach_residual else x
        h = residual + self.attention(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self, config, bugs_by_layer):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, bugs_by_layer(i)) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids):                           # [batch, seq], as transformers takes them
        x = self.embed_tokens(input_ids.t())
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Port(nn.Module):
    """Returns logits [seq, batch, vocab]."""

    def __init__(self, config, bugs_by_layer=lambda i: ()):
        super().__init__()
        self.model = Model(config, bugs_by_layer)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))


def port_of(reference, bugs_by_layer=lambda i: (), dtype=None):
    """The port with `reference`'s weights (fused where the port fuses), optionally in `dtype`."""
    port = Port(reference.config, bugs_by_layer)
    ref = reference.state_dict()
    own = {}
    for name in port.state_dict():
        if ".attention.qkv." in name:
            base = name.replace("attention.qkv.weight", "self_attn.")
            own[name] = torch.cat([ref[base + p + "_proj.weight"] for p in "qkv"], 0)
        elif ".mlp.gate_up." in name:
            base = name.replace("gate_up.weight", "")
            own[name] = torch.cat([ref[base + "gate_proj.weight"], ref[base + "up_proj.weight"]], 0)
        else:
            own[name] = ref[name.replace(".attention.", ".self_attn.")]
    port.load_state_dict(own)
    port = port.eval()
    return port.to(dtype) if dtype is not None else port


# The fixtures the compare tests share (imported into each test module).
@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The models are small: one intra-op thread runs them as fast, and does not wait on a busy
    second core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference():
    return llama()
