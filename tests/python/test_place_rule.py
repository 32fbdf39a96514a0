"""The place rule from Python: an inf/nan is an error where it leaves the module that made it. A
nanoGPT-style model, whose attention masks its scores with -inf and softmaxes them, trains watched;
a real overflow still stops it where HF's class stops; a mask handed into a module runs on (HF's
class stops there); a value returned, or written into a parameter, stops; strict=True stops at
every op; allow_nonfinite lets a meant value through, counted."""

import contextlib
import io
import json
import os
import re
import subprocess

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from nanogpt import masked_scores, nanogpt, tokens
from overflow_sentinel import DebugUnderflowOverflow, NonFiniteError
from tiers import both_tiers, named

BATCH, LENGTH = 4, 12


def train(model, steps, debug=None):
    """AdamW steps of next-token prediction; returns the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        batch = tokens(step, BATCH, LENGTH)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_nanogpt_trains_watched_for_several_adamw_steps_and_counts_its_masks():
    unwatched = nanogpt()
    expected = train(unwatched, 4)
    model = nanogpt()
    debug = DebugUnderflowOverflow(model, exact=True)  # (counted op by op)
    assert train(model, 4) == expected  # watching changes nothing
    assert debug.batch_number == 4 and debug.report is None
    rows = {(r["module_path"], r["op"]): r for r in debug.tolerated()}
    # Only the masks were tolerated: each layer's masked_fill, every step, every masked score.
    assert set(rows) == {("h.0.attn", "aten::masked_fill"), ("h.1.attn", "aten::masked_fill")}, rows
    for row in rows.values():
        assert row["frames"] == 4 and row["first_batch"] == 0 and row["last_batch"] == 3
        assert row["neg_inf"] == 4 * masked_scores(model, BATCH, LENGTH)
        assert row["pos_inf"] == row["nan"] == 0 and not row["allowed"]
        assert row["module_class"] == "CausalSelfAttention"
    for a, b in zip(unwatched.parameters(), model.parameters()):
        assert torch.equal(a, b)
    debug.close()


def test_strict_stops_nanogpt_at_its_mask_in_the_first_batch():
    model = nanogpt()
    debug = DebugUnderflowOverflow(model, strict=True)
    with pytest.raises(NonFiniteError) as caught:
        train(model, 1)
    report = caught.value.report
    assert report.batch_number == 0
    assert report.trigger.op == "aten::masked_fill" and report.trigger.module_path == "h.0.attn"
    assert report.tolerated == []
    debug.close()


@both_tiers
def test_a_real_overflow_in_nanogpt_stops_where_hfs_class_stops_naming_the_op_that_made_it(tier):
    transformers = pytest.importorskip("transformers")
    from transformers.debug_utils import DebugUnderflowOverflow as HfDebug

    def run(watcher):
        model = nanogpt()
        train(model, 1)
        with torch.no_grad():
            model.h[1].mlp.c_fc.weight.fill_(3e38)
        debug = watcher(model)
        try:
            train(model, 1)
        except ValueError as error:
            return error, debug
        return None, debug

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        hf_error, _ = run(HfDebug)
    assert hf_error is not None
    hf_stop = re.findall(r"^ {18}(\S+) (\S+)$", printed.getvalue(), re.M)[-1]  # HF's last frame: its module
    assert hf_stop == ("h.1.mlp.c_fc", "Linear")
    ours, debug = run(DebugUnderflowOverflow)
    assert isinstance(ours, NonFiniteError)
    report = named(ours)
    assert report.batch_number == 0
    assert report.trigger.module_path == "h.1.mlp.c_fc" and report.trigger.op == "return"
    assert report.escape == "returned"
    assert report.origin_frame.module_path == "h.1.mlp.c_fc" and report.origin_frame.op == "aten::linear"
    assert "aten::linear in h.1.mlp.c_fc (Linear) produced the first inf/nan" in report.origin
    # The masks of the batch so far are still counted, beside the error.
    assert any(r.op == "aten::masked_fill" for r in report.tolerated)
    debug.close()


class MaskedAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x, additive_mask):
        scores = x @ x.transpose(-2, -1) + additive_mask
        return self.proj(torch.softmax(scores, dim=-1) @ x)


class MaskMaker(nn.Module):
    def forward(self, length: int):
        return torch.full((length, length), float("-inf")).triu(1)


class PassesAMask(nn.Module):
    """Makes an additive -inf mask itself and hands it to its attention: HF's class stops at the
    attention's input; the mask never leaves this model's root."""

    def __init__(self, d=8, mask_module=False):
        super().__init__()
        self.attn = MaskedAttention(d)
        self.mask = MaskMaker() if mask_module else None

    def forward(self, x):
        length = x.size(1)
        mask = self.mask(length) if self.mask is not None else torch.full((length, length), float("-inf")).triu(1)
        return self.attn(x, mask)


@both_tiers
def test_a_mask_handed_into_a_sub_module_runs_on_where_hfs_class_stops(capsys, tier):
    transformers = pytest.importorskip("transformers")
    from transformers.debug_utils import DebugUnderflowOverflow as HfDebug

    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    hf_model = PassesAMask()
    HfDebug(hf_model)
    with pytest.raises(ValueError):
        hf_model(x)
    model = PassesAMask()
    debug = DebugUnderflowOverflow(model)
    out = model(x)
    assert torch.isfinite(out).all()
    assert debug.report is None
    if tier == "boundary":  # (what no module returns is not counted there: docs/nonfinite.md)
        assert debug.tolerated() == []
        return debug.close()
    rows = {(r["module_path"], r["op"]): r for r in debug.tolerated()}
    # The mask's 5 * 4 / 2 -inf above the diagonal, made in the root; the scores of both rows of
    # the batch masked by the attention it was handed to.
    assert rows[("", "aten::triu")]["neg_inf"] == 10 and rows[("", "aten::triu")]["module_class"] == "PassesAMask"
    assert rows[("attn", "aten::add")]["neg_inf"] == 2 * 10
    assert debug.report is None
    debug.close()


@both_tiers
def test_a_module_returning_a_mask_stops_there_unless_allowed(capsys, tier):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    model = PassesAMask(mask_module=True)
    debug = DebugUnderflowOverflow(model)
    with pytest.raises(NonFiniteError) as caught:
        model(x)
    report = named(caught.value)
    assert report.trigger.module_path == "mask" and report.trigger.op == "return" and report.escape == "returned"
    assert report.origin_frame.op in ("aten::full", "aten::triu")
    debug.close()
    allowed = DebugUnderflowOverflow(model, allow_nonfinite=["mask return output"])
    assert torch.isfinite(model(x)).all()
    rows = [r for r in allowed.tolerated() if r["allowed"]]
    # (The boundary tier's frame of the module is its forward's: a "return" pattern covers it.)
    returned = "return" if tier == "exact" else "forward"
    assert [(r["module_path"], r["op"], r["neg_inf"]) for r in rows] == [("mask", returned, 10)]
    allowed.close()
    # A +inf where the pattern allows -inf only is still an error.
    class PlusMask(MaskMaker):
        def forward(self, length: int):
            return torch.full((length, length), float("inf")).triu(1)
    model.mask = PlusMask()
    plus = DebugUnderflowOverflow(model, allow_nonfinite=["mask return output"])
    with pytest.raises(NonFiniteError):
        model(x)
    plus.close()


class WritesItsWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.mul_(1e38).mul_(1e38)  # written into a parameter: inf
        return x * 2


def test_a_value_written_into_a_parameter_stops_at_the_write():
    model = WritesItsWeight()
    debug = DebugUnderflowOverflow(model, exact=True)  # (seen at the write op by op only)
    with pytest.raises(NonFiniteError) as caught:
        model(torch.ones(2, 4))
    report = caught.value.report
    assert report.trigger.op == "aten::mul_" and report.escape == "written"
    assert "wrote it into a tensor its module did not make" in report.origin
    debug.close()


def test_allow_nonfinite_patterns_that_match_nothing_are_said_once_and_bad_ones_are_errors(capsys):
    model = PassesAMask()
    debug = DebugUnderflowOverflow(model, allow_nonfinite=["encoder\\..* aten::add", "attn"])
    out = capsys.readouterr().out
    assert out.count("matches no module") == 1 and "'encoder\\..* aten::add'" in out and "'attn'" not in out
    debug.close()
    with pytest.raises(ValueError, match=r"allow_nonfinite\[1\] 'attn\( aten::add' has a module regex"):
        DebugUnderflowOverflow(model, allow_nonfinite=["attn", "attn( aten::add"])
    with pytest.raises(ValueError, match=r"kind 'inf-'"):
        DebugUnderflowOverflow(model, allow_nonfinite=["attn aten::add input[1] inf-"])
    with pytest.raises(TypeError, match="allow_nonfinite"):
        DebugUnderflowOverflow(model, allow_nonfinite=3)
    DebugUnderflowOverflow(model, allow_nonfinite="attn").close()  # one pattern stands for a list of one


def sentinel_run(tmp_path, model, name, *flags):
    """`sentinel run` on `model` scripted, over three batches of tokens: its exit status and the
    JSON report it wrote (None when none)."""
    cli = os.environ.get("SENTINEL_CLI")
    if not cli or not os.path.exists(cli):
        pytest.skip("SENTINEL_CLI (the sentinel program) is not set: run through ctest")
    torch.jit.script(model).save(str(tmp_path / f"{name}.pt"))
    torch.save([tokens(seed, BATCH, LENGTH)[:, :-1] for seed in range(3)], str(tmp_path / "batches.pt"))
    reports = tmp_path / f"{name}_reports"
    done = subprocess.run([cli, "run", "--model", str(tmp_path / f"{name}.pt"), "--inputs", str(tmp_path / "batches.pt"),
                           "--report-dir", str(reports), *flags], capture_output=True, text=True)
    found = sorted(reports.glob("sentinel_batch*.json")) if reports.exists() else []
    return done, (json.loads(found[0].read_text()) if found else None)


def test_scripted_nanogpt_runs_through_sentinel_run_and_stops_only_on_a_real_overflow(tmp_path):
    model = nanogpt()
    done, report = sentinel_run(tmp_path, model, "clean")
    assert done.returncode == 0 and report is None, done.stdout + done.stderr
    done, report = sentinel_run(tmp_path, model, "strict", "--set", "strict=true")
    assert done.returncode == 3, done.stdout + done.stderr
    assert report["frames"][-1]["op"] == "aten::masked_fill" and report["batch_number"] == 0
    with torch.no_grad():
        model.h[1].mlp.c_fc.weight.fill_(3e38)
    done, report = sentinel_run(tmp_path, model, "planted")
    assert done.returncode == 3, done.stdout + done.stderr
    # TorchScript shows no module's return: the inf is an error where the next module reads it.
    assert report["batch_number"] == 0 and report["escape"] == "read"
    assert report["origin_frame"]["module_path"] == "h.1.mlp.c_fc"
    assert report["frames"][-1]["module_path"] == "h.1.mlp.gelu"
    assert any(row["op"] == "aten::masked_fill" and row["module_path"] == "h.0.attn" for row in report["tolerated"])


def amp_training(model, steps, scaler):
    """fp16 autocast steps on the CPU with `scaler`; the scale before each step and after its
    update (GradScaler halves it, here by 1000, on each step it skips)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scales = []
    for step in range(steps):
        batch = tokens(step, BATCH, LENGTH)
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        scales.append((before, scaler.get_scale()))
    return scales


@both_tiers
def test_an_fp16_amp_loop_whose_grad_scaler_skips_steps_runs_on_and_counts_them(capsys, tier):
    def scaler():
        return torch.amp.GradScaler("cpu", init_scale=2.0 ** 40, backoff_factor=1e-3, growth_interval=1000)

    plain = nanogpt()
    expected = amp_training(plain, 5, scaler())
    # The scaler's own verdicts, the oracle: a step is skipped when its update lowered the scale.
    skipped = [step for step, (before, after) in enumerate(expected) if after < before]
    assert skipped and len(skipped) < 5, expected
    model = nanogpt()
    debug = DebugUnderflowOverflow(model)
    assert amp_training(model, 5, scaler()) == expected  # no stop, and the same training
    assert [s["batch_number"] for s in debug.amp_skipped_steps] == skipped
    assert [s["scale"] for s in debug.amp_skipped_steps] == [expected[step][0] for step in skipped]
    # (Exact mode names the node that made the inf; the boundary tier the gradient that held it,
    # with no replay: the scaler's skip is no error.)
    made_by = "origin: backward node" if tier == "exact" else "the parameter gradients of"
    assert all(made_by in s["origin"] for s in debug.amp_skipped_steps), debug.amp_skipped_steps
    assert capsys.readouterr().out.count("GradScaler skips the step of batch") == len(skipped)
    for a, b in zip(plain.parameters(), model.parameters()):
        assert torch.equal(a, b)
    debug.close()
    # Without a scaler, the same inf gradient is an error out of backward().
    model = nanogpt()
    debug = DebugUnderflowOverflow(model)
    batch = tokens(0, BATCH, LENGTH)
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
    with pytest.raises(NonFiniteError) as caught:
        (loss * 2.0 ** 40).backward()
    assert caught.value.report.trigger.direction == "backward"
    debug.close()


class Checkpointed(nn.Module):
    """`inner` run under gradient checkpointing: its forward runs again inside the backward."""

    def __init__(self, inner, reentrant):
        super().__init__()
        self.inner = inner
        self.reentrant = reentrant

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=self.reentrant)


def checkpointed_nanogpt(reentrant):
    model = nanogpt()
    for i, block in enumerate(model.h):
        model.h[i] = Checkpointed(block, reentrant)
    return model


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_recomputes_without_a_batch_or_a_false_stop(reentrant):
    plain = checkpointed_nanogpt(reentrant)
    expected = train(plain, 3)
    model = checkpointed_nanogpt(reentrant)
    debug = DebugUnderflowOverflow(model, max_frames_to_save=100000, exact=True)  # (the recomputed op frames)
    assert train(model, 3) == expected
    # One batch a step: the forwards recomputed inside the backward open none, and their masks,
    # made again there, are neither gradients nor counted twice.
    assert debug.batch_number == 3 and debug.report is None
    masks = [r for r in debug.tolerated() if r["op"] == "aten::masked_fill"]
    assert len(masks) == 2 and all(r["frames"] == 3 for r in masks), masks
    # The recomputed ops are recorded, marked, in their blocks: the same ops on the same values as
    # the step's forward ran there (the non-reentrant form stops once it has what the backward
    # needs: the first of them).
    last = [f for f in debug.saved_frames() if f.batch_number == 2]
    for block in ("h.0.inner", "h.1.inner"):
        def ops(recomputed):
            return [(f.module_path, f.op, [(e.label, e.stats.abs_min, e.stats.abs_max) for e in f.entries])
                    for f in last if f.direction == "forward" and f.recomputed == recomputed
                    and (f.module_path + ".").startswith(block + ".")]
        recomputed, forward = ops(True), ops(False)
        assert recomputed and recomputed == forward[: len(recomputed)], block
    assert all(f.module_path.startswith("h.") for f in last if f.recomputed)
    debug.close()


@pytest.mark.parametrize("reentrant", [True, False])
def test_an_inf_gradient_inside_a_checkpointed_module_is_still_caught(reentrant):
    from models import SqrtHead

    model = Checkpointed(SqrtHead(), reentrant)
    debug = DebugUnderflowOverflow(model, exact=True)  # (a backward inf that reaches no .grad)
    with pytest.raises(NonFiniteError) as caught:
        model(torch.ones(2, 4, requires_grad=True)).sum().backward()
    report = caught.value.report
    assert report.trigger.direction == "backward" and report.batch_number == 0
    assert report.trigger.op == "SqrtBackward0" and report.trigger.module_path == "inner"
    assert debug.batch_number == 1
    debug.close()


class ExpFunction(torch.autograd.Function):
    """A custom autograd Function: its own ops run inside one event of its own."""

    @staticmethod
    def forward(ctx, x):
        y = (x * 100).exp()
        ctx.save_for_backward(y)
        return y.clamp(max=1.0)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y * 100


class UsesExpFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return ExpFunction.apply(self.lin(x)) + 1


def test_the_ops_inside_a_custom_autograd_function_are_watched_and_its_backward_named():
    torch.manual_seed(0)
    model = UsesExpFunction()
    x = torch.randn(2, 4)
    debug = DebugUnderflowOverflow(model, strict=True)
    with torch.no_grad():
        model(x * 0.01)  # finite
    with pytest.raises(NonFiniteError) as caught:
        model(x * 10)
    assert caught.value.report.trigger.op == "aten::exp" and caught.value.report.produced_here
    debug.close()
    # Under the place rule exp's inf stays inside the module (clamp makes it finite); its backward
    # multiplies by it: an inf gradient, named in the backward.
    debug = DebugUnderflowOverflow(model, exact=True)  # (counted op by op)
    y = model(x * 10)
    assert torch.isfinite(y).all()
    with pytest.raises(NonFiniteError) as caught:
        y.sum().backward()
    assert caught.value.report.trigger.direction == "backward"
    assert [r["op"] for r in debug.tolerated()] == ["aten::exp"]
    debug.close()


def test_an_inf_the_program_passes_as_a_number_is_its_own_until_it_is_written_into_a_gradient():
    # clip_grad_norm_(parameters, inf), as Trainer calls it for its logs, computes inf / norm and
    # clamps it to 1: the inf is the program's constant, not an overflow.
    model = nn.Linear(4, 3)
    debug = DebugUnderflowOverflow(model, exact=True)
    with debug.batch():
        model(torch.randn(2, 4)).sum().backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        assert torch.isfinite(norm)
        scaled = torch.ones(3) * float("inf")  # values made from it, outside the model, run on
        (scaled - scaled).clamp(0, 1)
        # A loss that masks the logits with -inf, in place or not, and a tensor full of inf.
        logits = model(torch.randn(2, 4))
        mask = torch.tensor([[True, False, False], [False, False, True]])
        logits.masked_fill(mask, float("-inf")).log_softmax(-1)
        logits.detach().masked_fill_(mask, float("-inf"))
        torch.full((2,), float("inf"))
    assert debug.report is None
    rows = {r["op"]: r for r in debug.tolerated()}
    assert rows["aten::mul"]["pos_inf"] >= 3 and rows["aten::sub"]["nan"] == 3, rows
    assert rows["aten::masked_fill"]["neg_inf"] == 2 and rows["aten::full"]["pos_inf"] == 2, rows
    debug.close()
    # Written into a gradient, such a value is an error; so is an overflow from finite inputs.
    for poison, op in ((lambda: model.weight.grad.mul_(float("inf")), "aten::mul_"),
                       (lambda: model.weight.grad.masked_fill_(model.weight > 0, float("-inf")), "aten::masked_fill_"),
                       (lambda: model.weight.grad.copy_(torch.zeros_like(model.weight) * float("nan")), "aten::copy_"),
                       (lambda: torch.full((2,), 1e30) * torch.full((2,), 1e30), "aten::mul"),
                       # made from a constant, then handed to the model: its input, an error there
                       (lambda: model(torch.ones(2, 4) * float("nan")), "aten::linear")):
        model.zero_grad()  # (the case before left its gradient poisoned)
        debug = DebugUnderflowOverflow(model, exact=True)
        with pytest.raises(NonFiniteError) as caught:
            with debug.batch():
                model(torch.randn(2, 4)).sum().backward()
                poison()
        assert caught.value.report.trigger.op == op
        debug.close()
