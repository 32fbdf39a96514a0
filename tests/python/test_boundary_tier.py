"""The boundary tier (Python's default, `exact=False`): each module's forward is one frame read as
it returns, no op callback runs in an ordinary batch, and at an inf/nan the batch is replayed op by
op, whose report names what exact mode (`exact=True`) names."""

import threading

import pytest
import torch
from torch import nn

import overflow_sentinel
from overflow_sentinel import DebugUnderflowOverflow, NonFiniteError, Watch, _native

from models import Mlp, SqrtHead, SqrtOfZero, line_of, plant_overflow, tiny_t5
from tiers import both_tiers


def first_error(make_watch, run):
    w = make_watch()
    try:
        with pytest.raises(NonFiniteError) as caught:
            run()
        return caught.value
    finally:
        w.close()


def on_a_thread_of_its_own(run):
    """Runs `run` on a new thread and raises what it raised: LibTorch's op callbacks are per
    thread, and the suite's earlier tests leave watchdogs alive on the main thread until collected."""
    errors = []

    def guarded():
        try:
            run()
        except Exception as error:  # noqa: BLE001 - raised below, on the test's thread
            errors.append(error)

    thread = threading.Thread(target=guarded)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def answers(report):
    """What a detection names: the module that let the value out, the op that made it, the batch
    and the Python line."""
    made = report.origin_frame
    return {"module": report.trigger.module_path, "direction": report.trigger.direction,
            "batch": report.batch_number, "origin": report.origin,
            "made_by": None if made is None else (made.op, made.module_path),
            "line": report.python_stack[0] if report.python_stack else None}


def test_the_replay_names_a_forward_overflow_as_exact_mode_does(capsys):
    model = tiny_t5()
    plant_overflow(model, block=1)
    exact = first_error(lambda: DebugUnderflowOverflow(model, exact=True), lambda: model(torch.ones(2, 8)))
    capsys.readouterr()
    boundary = first_error(lambda: DebugUnderflowOverflow(model, exact=False), lambda: model(torch.ones(2, 8)))
    out = capsys.readouterr().out
    # What the boundaries saw: wo (handed the mul's inf by its module) returned it.
    trigger = boundary.report.trigger
    assert (trigger.op, trigger.module_path) == ("forward", "block.1.layer.0.DenseReluDense.wo")
    assert [e.label for e in trigger.entries] == ["weight", "input[0]", "output"]  # as HF lists them
    assert {f.op for f in boundary.report.frames} <= {"call", "forward"}
    # The replay, op by op, names the op, the module, the batch and the line exact mode names.
    replay = boundary.replay
    assert replay.reproduced and replay.report is boundary.report.replay.report
    assert answers(replay.report) == answers(exact.report)
    assert exact.report.origin_frame.op == "aten::mul"
    assert f"models.py:{line_of('LEAVES_LINE')}:" in replay.report.python_stack[0]
    assert f"models.py:{line_of('OVERFLOW_LINE')}:" in replay.origin_line
    # Printed: the boundary's report, then the replay's, last.
    assert out.index("replaying batch 0 under op-level watching") < out.rindex("Detected inf/nan")


def test_the_replay_names_a_backward_inf_as_exact_mode_does():
    def run(make_watch):
        model = SqrtOfZero()
        x = torch.ones(3, 4)
        return first_error(lambda: make_watch(model), lambda: model(x).sum().backward())

    exact = run(lambda m: Watch(m, exact=True))
    boundary = run(lambda m: Watch(m, exact=False))
    # The boundaries see the gradient that reached a parameter; the replay sees the node.
    assert boundary.report.trigger.op == "AccumulateGrad"
    assert boundary.report.trigger.module_path == "lin"
    assert boundary.replay.reproduced
    assert "SqrtBackward0" in boundary.replay.report.origin
    got, want = answers(boundary.replay.report), answers(exact.report)
    assert (got["module"], got["direction"], got["origin"]) == (want["module"], want["direction"], want["origin"])


def test_a_backward_inf_that_reaches_no_gradient_is_seen_in_exact_mode_only():
    # relu's backward zeroes sqrt's inf gradient before it reaches a weight (SqrtHead's note).
    torch.manual_seed(0)
    model, x = SqrtHead(), torch.rand(3, 4)
    with Watch(model, exact=False):
        model(x).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert "SqrtBackward0" in first_error(lambda: Watch(model, exact=True),
                                          lambda: model(x).sum().backward()).report.origin


def test_an_ordinary_batch_runs_no_op_callback():
    seen, calls = {}, []

    def run():
        seen["before"] = _native.record_function_callbacks_installed()
        model = Mlp()
        model.fc2.register_forward_hook(lambda *a: calls.append(_native.record_function_callbacks_installed()))
        for exact in (False, True):
            with Watch(model, exact=exact):
                model(torch.ones(2, 16))
        # A traced batch watches op by op, and prints its ops.
        with Watch(model, exact=False, trace_batch_nums=[1]) as w:
            model(torch.ones(2, 16))
            seen["traced_first"] = w._native.watching_ops
            model(torch.ones(2, 16))
            seen["traced_second"] = w._native.watching_ops

    on_a_thread_of_its_own(run)
    assert seen == {"before": False, "traced_first": False, "traced_second": True}
    assert calls == [False, True, False, True]  # boundary, exact, boundary, traced


class MaskedAttention(nn.Module):
    """The mask is made by the model's own code and handed down: -inf where a key is hidden."""

    def __init__(self):
        super().__init__()
        self.score = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x, mask):
        return self.out(torch.softmax(self.score(x) + mask, dim=-1))


class MaskingModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = MaskedAttention()

    def forward(self, x):
        mask = torch.full((x.shape[0], x.shape[-1]), float("-inf")).triu(1)
        return self.attn(x, mask)


def test_a_mask_handed_down_is_no_error_and_frames_show_what_crossed():
    model = MaskingModel()
    with Watch(model, exact=False) as w:
        model(torch.randn(8, 8))
        frames = w.saved_frames()
    attn = [f for f in frames if f.module_path == "attn"][-1]
    handed = [e for e in attn.entries if e.label == "input[1]"][0]
    assert handed.stats.neg_inf > 0  # the mask, read as handed, not judged
    assert [f.module_path for f in frames] == ["", "attn.score", "attn.out", "attn", ""]
    # A value made and consumed inside a module is not seen at its boundary: nothing is counted.
    with Watch(model, exact=False) as w:
        model(torch.randn(8, 8))
        assert w.tolerated() == []
    with Watch(model, exact=True) as w:
        model(torch.randn(8, 8))
        assert w.tolerated() and w.tolerated()[0]["neg_inf"] > 0


@pytest.mark.parametrize("implementation", [{"foreach": False}, {"foreach": True}, {"fused": True}],
                         ids=["single_tensor", "foreach", "fused"])
def test_what_the_optimizer_wrote_is_read_after_its_step_and_named(implementation):
    torch.manual_seed(0)
    model = Mlp()
    # fc2.bias.grad is 2: 6e38 is inf. (The fused step writes without counting a version: the
    # parameters' reads in the forward are not taken for their new values.)
    optimizer = torch.optim.SGD(model.parameters(), lr=3e38, **implementation)
    w = overflow_sentinel.watch_steps(model, optimizer, exact=False)
    model(torch.ones(2, 16)).sum().backward()
    with pytest.raises(NonFiniteError) as caught:
        optimizer.step()
    report = caught.value.report
    w.close()
    assert report.trigger.op == "optimizer.step" and report.trigger.direction == "forward"
    bad = [e.label for e in report.trigger.entries if e.stats.pos_inf + e.stats.neg_inf + e.stats.nan]
    assert bad and all(label.startswith(("fc1.", "fc2.")) for label in bad)
    # The first non-finite element, as torch itself finds it in that parameter.
    name, index = report.first_nonfinite["tensor"], report.first_nonfinite["index"]
    param = dict(model.named_parameters())[name]
    assert not torch.isfinite(param[index]) and getattr(caught.value, "replay", None) is None


def test_an_input_changed_in_place_before_the_backward_is_named():
    model = SqrtOfZero()
    x = torch.ones(3, 4)
    with Watch(model, exact=False):
        out = model(x)
        x.mul_(2)
        with pytest.raises(NonFiniteError) as caught:
            out.sum().backward()
    assert any("args[0] was changed in place" in note for note in caught.value.replay.notes)


class DropoutOverflow(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        return self.lin(self.drop(x) * 2)  # dropout doubles what it keeps: 2 * 2 * 1e38 is inf


def test_a_dropout_batch_replays_with_its_random_numbers():
    model = DropoutOverflow().train()
    torch.manual_seed(3)
    with Watch(model, exact=False):
        with pytest.raises(NonFiniteError) as caught:
            model(torch.full((4, 64), 1e38))
    error = caught.value
    kept = [e for e in error.report.trigger.entries if e.label == "input[0]"][0].stats.pos_inf
    assert error.report.trigger.module_path == "lin" and kept > 0
    replayed = error.replay.report
    assert error.replay.reproduced and replayed.origin_frame is not None
    made = [e for e in replayed.origin_frame.entries if e.role == "output"][0].stats.pos_inf
    assert made == kept  # the same elements kept by the same mask


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_exact_must_be_a_bool(value):
    with pytest.raises((TypeError, ValueError), match="exact"):
        Watch(Mlp(), exact=value)


@pytest.mark.parametrize("exact", [False, True])
def test_watching_changes_no_result(exact):
    torch.manual_seed(0)
    model = tiny_t5()
    x = torch.randn(2, 8)
    plain = model(x)
    plain.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with Watch(model, exact=exact):
        watched = model(x)
        watched.sum().backward()
    assert torch.equal(plain, watched)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))


class SqrtOfInput(nn.Module):
    """sqrt of an identity layer: its gradient is inf where the input is 0, and reaches the weight."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.eye(4))

    def forward(self, x):
        return torch.sqrt(self.lin(x))


def test_gradient_accumulation_replays_the_micro_batch_that_made_the_inf():
    # Two micro-batches make one optimizer step; only the second's input holds a 0.
    model = SqrtOfInput()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    w = overflow_sentinel.watch_steps(model, optimizer, exact=False)
    clean, zero = torch.ones(2, 4), torch.ones(2, 4)
    zero[1, 2] = 0.0
    model(clean).sum().backward()
    model(zero).sum().backward()
    with pytest.raises(NonFiniteError) as caught:
        optimizer.step()
    w.close()
    error = caught.value
    assert error.report.trigger.op == "AccumulateGrad" and error.report.batch_number == 0
    # Each micro-batch replayed as it ran, with the gradient its output got: the second makes it.
    replay = error.replay
    assert replay.reproduced and "SqrtBackward0" in replay.report.origin
    made = [e for e in replay.report.trigger.entries if e.role == "output"]
    assert any(e.stats.pos_inf for e in made)
    # torch's own backward of the second micro-batch alone is where the inf is, not the first's.
    for x, finite in ((clean, True), (zero, False)):
        x = x.clone().requires_grad_()
        torch.sqrt(x).sum().backward()
        assert bool(torch.isfinite(x.grad).all()) == finite


def test_a_kv_cache_the_forward_extended_is_named_and_left_as_the_run_left_it():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=100,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    first, second = torch.randint(1, 100, (1, 6)), torch.randint(1, 100, (1, 1))
    with torch.no_grad(), Watch(model, exact=False):
        cache = model(input_ids=first, use_cache=True).past_key_values
        model.transformer.h[1].mlp.c_fc.weight.fill_(1e38)
        with pytest.raises(NonFiniteError) as caught:
            model(input_ids=second, past_key_values=cache, use_cache=True)
    error = caught.value
    assert error.report.trigger.module_path == "transformer.h.1.mlp.c_fc"
    # The run's own forward extended the cache before it stopped: the replay says so, and runs on
    # a copy of the cache object (the run's keeps what the run made: 7 positions in each layer
    # the forward reached, none added by the replay).
    notes = " ".join(error.replay.notes)
    assert "kwargs['past_key_values']" in notes and "was replaced" in notes, notes
    assert error.replay.reproduced and "aten::addmm in transformer.h.1.mlp.c_fc" in error.replay.report.origin
    assert cache.get_seq_length() == 7


def test_the_loops_ops_are_watched_from_the_backward_to_the_step_and_no_longer():
    seen = []

    def run():
        torch.manual_seed(0)
        model = Mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        w = overflow_sentinel.watch_steps(model, optimizer, exact=False)
        for step in range(2):
            seen.append(_native.record_function_callbacks_installed())  # before the forward
            model(torch.ones(2, 16)).sum().backward()
            seen.append(_native.record_function_callbacks_installed())  # clipping's turn
            if step == 1:
                model.fc1.weight.grad[0, 0] = 1e20  # finite, its square is not: the norm is inf
            try:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            except NonFiniteError as error:
                seen.append(error.report.trigger.op)
            seen.append(_native.record_function_callbacks_installed())  # after the step
        w.close()

    on_a_thread_of_its_own(run)
    assert seen == [False, True, False, False, True, "aten::_foreach_norm", False], seen


def test_a_ddp_models_batch_is_replayed_inside_the_wrapper_with_exact_modes_answers(tmp_path):
    """DDP's forward and backward join its reducer's collectives: the replay runs the module it
    wraps, without them, and names what exact mode names."""
    import torch.distributed as dist

    def run(exact, store):
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        try:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
            ddp = nn.parallel.DistributedDataParallel(model)
            x = torch.randn(8, 16)
            w = Watch(ddp, exact=exact)
            with w.batch():
                ddp(x).sum().backward()
            with torch.no_grad():
                model[0].weight.mul_(1e38)  # finite forward; the next layer's weight gradient overflows
            try:
                with pytest.raises(NonFiniteError) as caught:
                    with w.batch():
                        ddp(x).sum().backward()
            finally:
                w.close()
            return caught.value
        finally:
            dist.destroy_process_group()

    exact = run(True, tmp_path / "exact")
    boundary = run(False, tmp_path / "boundary")
    assert boundary.report.trigger.op == "AccumulateGrad"  # what the boundaries saw: a .grad
    replay = boundary.replay
    assert replay.reproduced and any("inside DistributedDataParallel without it" in n for n in replay.notes)
    assert exact.report.trigger.op == "AddmmBackward0"
    got, want = answers(replay.report), answers(exact.report)
    # (The replayed root is the wrapped module: its class, not the wrapper's, as the note says.)
    got["origin"] = got["origin"].replace("root (Sequential)", "root (DistributedDataParallel)")
    assert got == want


class MaskedByABuffer(nn.Module):
    """A causal mask kept as a floating buffer holding -inf: the model's constant."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("mask", torch.full((3, 3), float("-inf")).triu(1))

    def forward(self, x):
        h = self.lin(x)
        return (h @ h.transpose(-1, -2) + self.mask).softmax(-1) @ h


def test_a_buffer_that_held_an_inf_when_watching_began_is_not_taken_for_a_write():
    # Buffers are read after a training forward to see what it wrote (batch norm's statistics):
    # one that already held an inf/nan is the model's own constant, and never read.
    model = MaskedByABuffer().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    w = overflow_sentinel.watch_steps(model, optimizer, exact=False)
    for _ in range(3):
        model(torch.randn(2, 3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert w.report is None and w.batch_number == 3
    w.close()


@both_tiers
def test_a_loss_that_overflows_outside_the_model_is_named_where_each_tier_sees_it(tier):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    w = overflow_sentinel.watch_steps(model, optimizer)
    x = torch.randn(3, 4)
    try:
        with pytest.raises(NonFiniteError) as caught:
            for step in range(3):
                out = model(x)
                # log(0): -inf in the loss, and an inf gradient at the model's output.
                loss = (out - out.detach()).log().sum() if step == 1 else out.pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    finally:
        w.close()
    report = caught.value.report
    assert report.batch_number == 1
    if tier == "exact":  # the loss's own op, outside the model's modules
        assert (report.trigger.op, report.trigger.module_path, report.trigger.direction) == ("aten::log", "", "forward")
    else:  # the gradients after the backward; the replay says where the value came from
        assert (report.trigger.op, report.trigger.module_path) == ("AccumulateGrad", "0")
        assert any("reached the model's output was already non-finite" in n for n in caught.value.replay.notes)


def test_a_step_that_raises_in_the_loops_window_leaves_no_scope_open_on_the_thread():
    # The window sees the optimizer's step scope begin and closes inside it (the step's pre-hook,
    # which raises here): that scope must not stay open for the thread's later watchdogs, whose
    # ops outside the model would be taken for the optimizer's.
    def run():
        model = SqrtOfInput()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        w = overflow_sentinel.watch_steps(model, optimizer, exact=False)
        zero = torch.ones(2, 4)
        zero[1, 2] = 0.0
        model(zero).sum().backward()
        with pytest.raises(NonFiniteError):
            optimizer.step()
        w.close()
        later = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(later.parameters(), lr=0.1)
        w = overflow_sentinel.watch_steps(later, optimizer, exact=True)
        try:
            with pytest.raises(NonFiniteError) as caught:
                for step in range(2):
                    out = later(torch.ones(2, 4))
                    # The loop's own op makes -inf at the second step.
                    (out - out.detach()).log().sum().backward() if step else out.sum().backward()
                    optimizer.step()
                    optimizer.zero_grad()
        finally:
            w.close()
        trigger = caught.value.report.trigger
        assert (trigger.op, trigger.module_path) == ("aten::log", ""), (trigger.op, trigger.module_path)

    on_a_thread_of_its_own(run)
