"""Who made a value: a copy or a conversion is a frame (an alias-annotated op that returned new
memory), memory an op of the empty family made is never judged until something writes it, and the
running module owns its ops whichever module's parameters they read. Oracles: torch's own casts
and results, and HF's class where it has an answer."""

import contextlib
import copy
import io
import re

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from overflow_sentinel import DebugUnderflowOverflow, NonFiniteError
from tiers import both_tiers, named


class Caster(nn.Module):
    """Its forward is one cast."""

    def __init__(self, like=None):
        super().__init__()
        self.like = like

    def forward(self, x):
        return x.half() if self.like is None else x.to(self.like)


class CastsInTheMiddle(nn.Module):
    def __init__(self, like=None):
        super().__init__()
        self.pre = nn.Linear(6, 6)
        self.cast = Caster(like)

    def forward(self, x):
        return self.cast(self.pre(x)).float().sum()


def planted_half_overflow(model):
    """An input whose `pre` output has values beyond float16's range; returns it and how many
    elements float16 cannot hold (torch's own cast is the oracle)."""
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    with torch.no_grad():
        model.pre.weight.mul_(1e5)
        overflowing = int(torch.isinf(model.pre(x).half()).sum())
    assert overflowing > 0
    return x, overflowing


@pytest.mark.parametrize("like", [None, torch.zeros(1, dtype=torch.float16)], ids=["half", "to_other"])
@both_tiers
def test_an_overflowing_cast_in_a_submodule_is_the_origin_with_its_dtypes(like, tier):
    transformers = pytest.importorskip("transformers")
    from transformers.debug_utils import DebugUnderflowOverflow as HfDebug

    model = CastsInTheMiddle(like)
    x, overflowing = planted_half_overflow(model)
    printed = io.StringIO()
    hf_model = copy.deepcopy(model)
    HfDebug(hf_model)
    with contextlib.redirect_stdout(printed), pytest.raises(ValueError):
        hf_model(x)
    hf_stop = re.findall(r"^ {18}(\S+) (\S+)$", printed.getvalue(), re.M)[-1]
    assert hf_stop == ("cast", "Caster")  # HF's class names the casting module

    debug = DebugUnderflowOverflow(model)
    with pytest.raises(NonFiniteError) as caught:
        model(x)
    report = named(caught.value)
    assert report.trigger.module_path == "cast" and report.trigger.op == "return"
    assert report.escape == "returned"
    assert report.origin_frame.module_path == "cast" and report.origin_frame.op == "aten::to"
    assert f"float32 → float16: {overflowing} value{'s' if overflowing > 1 else ''} above 65504" in report.origin
    out = [e for e in report.origin_frame.entries if e.label == "output"][0]
    assert out.dtype == "float16" and out.stats.pos_inf + out.stats.neg_inf == overflowing
    debug.close()


class ScoresReshapedBeforeSoftmax(nn.Module):
    """scores.masked_fill(mask, -inf).transpose(1, 2).reshape(b, -1).softmax(-1) in one module:
    the reshape of a transposed tensor copies the tolerated -inf."""

    def __init__(self, d=6, contiguous=False):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.contiguous = contiguous

    def forward(self, x):
        b, t, _ = x.shape
        scores = self.q(x) @ x.transpose(1, 2)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        masked = scores.masked_fill(mask, float("-inf")).transpose(1, 2)
        if self.contiguous:
            return (masked.contiguous().softmax(-1) @ x).sum(-1)
        return masked.reshape(b, -1).softmax(-1)


@pytest.mark.parametrize("contiguous", [False, True], ids=["reshape", "contiguous"])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_a_tolerated_value_copied_inside_its_module_stays_tolerated(contiguous, training):
    torch.manual_seed(1)
    model = nn.Sequential(ScoresReshapedBeforeSoftmax(contiguous=contiguous), nn.Linear(5 if contiguous else 25, 2))
    model.train(training)
    inputs = [torch.linspace(-1, 1, 90).reshape(3, 5, 6) * (step + 1) for step in range(3)]
    with torch.no_grad():
        reference = [model(x) for x in inputs]
    debug = DebugUnderflowOverflow(model, exact=True)  # (counted op by op)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step, x in enumerate(inputs):
        out = model(x)
        if training:
            out.sum().backward()
            opt.step()
            opt.zero_grad()
        else:
            assert torch.equal(out, reference[step])  # watching changes nothing
    assert debug.batch_number == 3 and debug.report is None
    rows = {(r["module_path"], r["op"]) for r in debug.tolerated()}
    copier = "aten::contiguous" if contiguous else "aten::reshape"
    assert ("0", "aten::masked_fill") in rows and ("0", copier) in rows, rows
    debug.close()


class NanThenCopied(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.attn = nn.Linear(d, d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        h = self.attn(x).sqrt()  # NaN where negative, made in this module
        # (the reshape of the transposed tensor copies it)
        return self.out(h.transpose(1, 2).reshape(x.size(0), -1).reshape(x.shape))


@both_tiers
def test_a_nan_copied_then_read_by_another_module_names_the_op_that_made_it(tier):
    torch.manual_seed(2)
    model = nn.Sequential(NanThenCopied())
    debug = DebugUnderflowOverflow(model)
    with pytest.raises(NonFiniteError) as caught:
        model(torch.randn(2, 4, 6))
    report = named(caught.value)
    assert report.origin_frame is not None and report.origin_frame.op == "aten::sqrt"
    assert report.origin_frame.module_path == "0"
    assert "passed through" not in report.origin
    debug.close()


class Scale(nn.Module):
    def forward(self, x):
        return x * 1e5  # a float32 op under autocast: finite, beyond float16's range


@both_tiers
def test_an_autocast_linear_whose_input_does_not_fit_float16_names_that_input(tier):
    torch.manual_seed(3)
    model = nn.Sequential(Scale(), nn.Linear(6, 6))
    x = torch.randn(4, 6)
    with torch.autocast("cpu", dtype=torch.float16), torch.no_grad():
        big = model[0](x)
        assert big.dtype == torch.float32 and big.abs().max() > 65504 and torch.isfinite(big).all()
        assert not torch.isfinite(model[1](big)).all()  # torch's own autocast overflows there
    debug = DebugUnderflowOverflow(model)
    with pytest.raises(NonFiniteError) as caught, torch.autocast("cpu", dtype=torch.float16):
        model(x)
    report = named(caught.value)  # (the replay under the autocast the call ran in)
    origin = report.origin_frame or report.trigger
    assert origin.module_path == "1" and origin.op == "aten::linear"
    assert "input[0] (float32" in report.origin and "does not fit float16" in report.origin, report.origin
    debug.close()


# A custom op that fills its slice of a buffer it is handed and returns views of it, declaring no
# write (as FSDP2's fsdp::all_gather_copy_in does).
_lib = torch.library.Library("sentinel_test", "FRAGMENT")
_lib.define("copy_in(Tensor src, Tensor buffer, int rank) -> (Tensor, Tensor)")


@torch.library.impl(_lib, "copy_in", "CPU")
def _copy_in(src, buffer, rank):
    part = buffer.narrow(0, rank * src.numel(), src.numel())
    with torch.no_grad():
        part.copy_(src.reshape(-1))
    return part, buffer


class GathersIntoABuffer(nn.Module):
    def __init__(self, n=8, world=2, gather=False):
        super().__init__()
        self.lin = nn.Linear(n, n)
        self.scale = 1.0
        self.n, self.world, self.gather = n, world, gather

    def forward(self, x):
        buffer = torch.empty(self.n * self.world)
        shard = (self.lin(x) * self.scale).reshape(-1)
        part, whole = torch.ops.sentinel_test.copy_in(shard, buffer, 0)
        if self.gather:
            with torch.no_grad():  # (as FSDP2 gathers: autograd forbids writing the op's views)
                dist.all_gather_into_tensor(whole, part)
            return whole.sum()
        return part.sum() + whole.numel()


@pytest.fixture
def deterministic():
    # PyTorch then fills memory from `empty` with NaN: no test passes by a zeroed page.
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


@both_tiers
def test_a_buffer_from_empty_filled_by_a_custom_op_without_write_annotation_is_never_an_error(deterministic, tier):
    model = GathersIntoABuffer(n=8, world=2)
    x = torch.randn(1, 8)
    assert torch.isnan(torch.empty(16)).all()  # what the buffer holds before the op writes its half
    expected = model(x)
    debug = DebugUnderflowOverflow(model)
    for _ in range(3):
        assert torch.equal(model(x), expected)
    assert debug.report is None and debug.batch_number == 3
    if tier == "boundary":
        return  # (no op frames: the buffer never leaves the module)
    frames = [f for f in debug.saved_frames() if f.op == "sentinel_test::copy_in"]
    assert frames, [str(f) for f in debug.saved_frames()]
    reasons = {e.label: getattr(e, "skip_reason", None) for e in frames[-1].entries}
    assert reasons["input[1]"] == "uninitialized: not read"
    assert reasons["output[1]"] == "partly written: not read"
    debug.close()


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@both_tiers
def test_a_buffer_a_collective_filled_is_judged_again(deterministic, one_rank_group, tier):
    model = GathersIntoABuffer(n=8, world=1, gather=True)
    x = torch.randn(1, 8)
    debug = DebugUnderflowOverflow(model)
    assert torch.isfinite(model(x))
    assert debug.report is None
    model.scale = 1e39  # inf made in the root, tolerated there until the collective carries it
    with pytest.raises(NonFiniteError) as caught:
        model(x)
    trigger = named(caught.value).trigger
    assert trigger.op == "aten::sum"
    read = [e for e in trigger.entries if e.label == "input[0]"][0]
    assert getattr(read, "skip_reason", None) is None and read.stats.pos_inf + read.stats.neg_inf > 0
    debug.close()


class FunctionalAttention(nn.Module):
    """torchvision's and nn.MultiheadAttention's pattern: the child's weight, used functionally;
    the child's own forward never runs."""

    def __init__(self, d=6):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return F.linear(x * 2, self.proj.weight, self.proj.bias)


@both_tiers
def test_a_functional_call_with_a_childs_weight_belongs_to_the_running_module(tier):
    model = nn.Sequential(FunctionalAttention())
    x = torch.randn(3, 6)
    with torch.no_grad():
        model[0].proj.weight.fill_(3e38)
    debug = DebugUnderflowOverflow(model)
    with pytest.raises(NonFiniteError) as caught:
        model(x)
    report = named(caught.value)
    origin = report.origin_frame or report.trigger
    assert origin.op == "aten::linear" and origin.module_path == "0" and origin.module_class == "FunctionalAttention"
    labels = [e.label for e in origin.entries]
    assert "proj.weight" in labels and "proj.bias" in labels, labels
    debug.close()


class WithMultiheadAttention(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.mha = nn.MultiheadAttention(d, 2, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x)[0]


def test_multihead_attentions_out_proj_is_read_in_the_attention_not_in_out_proj():
    torch.manual_seed(1)  # (weights and an input whose product with out_proj's overflows)
    model = WithMultiheadAttention()
    with torch.no_grad():
        model.mha.out_proj.weight.fill_(3e38)  # out_proj's own forward never runs
    debug = DebugUnderflowOverflow(model, exact=True)  # (op frames)
    x = torch.randn(1, 3, 6)
    with pytest.raises(NonFiniteError) as caught:
        model(x)
    frames = caught.value.report.frames
    readers = [f for f in frames if any(e.label == "out_proj.weight" for e in f.entries)]
    assert readers and all(f.module_path == "mha" for f in readers), [str(f) for f in frames]
    assert not any(f.module_path == "mha.out_proj" for f in frames)
    debug.close()


class Wrapped(torch.Tensor):
    """A wrapper tensor subclass that keeps its elements in another tensor, as DTensor does, but
    under a name the watchdog does not know: its own memory is not its elements."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.inner if isinstance(t, Wrapped) else t  # noqa: E731
        return func(*torch.utils._pytree.tree_map(unwrap, args), **torch.utils._pytree.tree_map(unwrap, kwargs or {}))


class AddsAWrapped(nn.Module):
    def forward(self, x):
        return x + Wrapped(torch.full_like(x, float("nan")))


def test_a_tensor_subclass_the_watchdog_cannot_read_is_labelled_not_read():
    model = nn.Sequential(AddsAWrapped())
    debug = DebugUnderflowOverflow(model, exact=True)  # (op frames)
    with pytest.raises(NonFiniteError) as caught:  # the sum is a plain tensor full of NaN: read
        model(torch.randn(3, 4))
    assert "not read: input[1] (tensor subclass: not read)" in caught.value.report.origin, caught.value.report.origin
    frames = [f for f in caught.value.report.frames if f.op == "aten::add"]
    assert frames, [str(f) for f in caught.value.report.frames]
    reasons = {e.label: getattr(e, "skip_reason", None) for e in frames[0].entries}
    assert reasons["input[1]"] == "tensor subclass: not read", reasons
    debug.close()
