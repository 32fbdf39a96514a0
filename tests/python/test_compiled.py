"""torch.compile'd models (Inductor on the CPU): watched at the compiled call's boundary, the
failing batch replayed eagerly to name the op, said plainly when the replay does not reproduce it;
watching changes neither the graphs dynamo makes nor the results."""

import pytest
import torch
from torch import nn

from overflow_sentinel import NonFiniteError, Watch

from models import SqrtOfZero, line_of, plant_overflow, tiny_t5


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _stop_at_batch_3(model, w):
    for _ in range(3):
        model(torch.ones(2, 8))
    plant_overflow(w._model_ref())
    with pytest.raises(NonFiniteError) as caught:
        model(torch.ones(2, 8))
    return caught.value


def test_a_compiled_t5_stops_at_batch_3_and_its_eager_replay_names_the_mul(capsys, tmp_path):
    compiled = torch.compile(tiny_t5())
    w = Watch(compiled, report_dir=str(tmp_path), exact=True)
    error = _stop_at_batch_3(compiled, w)
    out = capsys.readouterr().out
    assert out.count("the model is compiled (torch.compile)") == 1
    report = error.report
    assert report.batch_number == 3
    # Compiled, the first op seen to read the inf is the extern GEMM of wo (Inductor's kernels
    # run no op): it is named by the parameter it reads.
    assert report.trigger.module_path == "block.1.layer.0.DenseReluDense.wo"
    assert report.trigger.op in ("aten::mm", "aten::addmm")
    # Its factors, left unread while its products were finite, are read once this one is not.
    assert any(e.role == "input" and e.kind == "tensor" and e.stats.pos_inf > 0 for e in report.trigger.entries)
    earlier = [f for f in report.frames[:-1] if f.op in ("aten::mm", "aten::addmm")]
    factors = [getattr(e, "skip_reason", None) for f in earlier for e in f.entries
               if e.role in ("input", "parameter") and getattr(e, "skip_reason", None) != "overwritten"]
    assert factors and all(reason == "not read: its product is finite" for reason in factors)
    # The replay, through the uncompiled module: the op, its module and where it left.
    replay = error.replay
    assert replay.reproduced and report.replay is replay
    assert replay.report.batch_number == 3 and replay.report.phase == "eager replay"
    assert "aten::mul in block.1.layer.0.DenseReluDense" in replay.report.origin
    assert f"models.py:{line_of('LEAVES_LINE')}:" in replay.report.python_stack[0]  # where it left the module
    assert f"models.py:{line_of('OVERFLOW_LINE')}:" in replay.origin_line  # the mul's own line
    assert "replaying batch 3 eagerly" in out and "aten::mul in block.1.layer.0.DenseReluDense" in out
    assert "aten::mul in block.1.layer.0.DenseReluDense made it at" in out
    assert "(eager replay)" in (tmp_path / "sentinel_batch3_replay.txt").read_text()
    assert (tmp_path / "sentinel_batch3.txt").exists()
    w.close()


def test_module_compile_is_watched_and_a_model_compiled_after_watching_is_noticed(capsys):
    model = tiny_t5()
    model.compile()
    w = Watch(model)
    error = _stop_at_batch_3(model, w)
    assert error.report.batch_number == 3 and error.replay.reproduced
    w.close()
    assert model._compiled_call_impl is not None and not hasattr(model._compiled_call_impl, "sentinel_compiled")

    torch._dynamo.reset()
    later = tiny_t5()
    w = Watch(later)
    compiled = torch.compile(later)
    compiled(torch.ones(2, 8))  # compiled now: this call is not watched, nor counted
    assert "compiled after it was watched" in capsys.readouterr().out
    error = _stop_at_batch_3(compiled, w)
    assert error.report.batch_number == 3 and error.replay.reproduced
    w.close()


def _counted_compile(model, watched, **compile_options):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, **compile_options)
    w = Watch(compiled) if watched else None
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = compiled(x)
    out.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    for p in model.parameters():
        p.grad = None
    if w is not None:
        w.close()
    counters = torch._dynamo.utils.counters
    return (dict(counters["graph_break"]), counters["stats"]["unique_graphs"]), out.detach(), grads


class WithBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.tanh(self.first(x))
        torch._dynamo.graph_break()
        return self.second(x) * 2


@pytest.mark.parametrize("make, compile_options", [(WithBreak, {}), (tiny_t5, {"fullgraph": True})])
def test_watching_makes_the_same_graphs_and_the_same_results_bit_for_bit(make, compile_options):
    torch.manual_seed(0)
    model = make()
    unwatched = _counted_compile(model, False, **compile_options)
    watched = _counted_compile(model, True, **compile_options)
    assert watched[0] == unwatched[0]
    assert torch.equal(watched[1], unwatched[1])
    assert all(torch.equal(a, b) for a, b in zip(watched[2], unwatched[2]))
    if make is WithBreak:
        assert sum(unwatched[0][0].values()) >= 1 and unwatched[0][1] == 2


def test_a_backward_inf_under_compile_is_replayed_with_its_backward():
    model = SqrtOfZero()
    compiled = torch.compile(model)
    w = Watch(compiled)
    with pytest.raises(NonFiniteError) as caught:
        with w.batch():
            compiled(torch.ones(2, 4)).sum().backward()
    report = caught.value.report
    assert report.trigger.direction == "backward"
    replay = caught.value.replay
    assert replay.reproduced, replay.notes
    assert replay.report.trigger.direction == "backward"
    assert "SqrtBackward0" in replay.report.origin
    w.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_every_factor_of_a_product_reaches_its_result_on_this_blas(dtype):
    # What leaving a compiled GEMM's factors unread while its result is finite rests on
    # (src/core/gemm_ops.h, factors_of_product): an inf or NaN anywhere in mm's, bmm's, addmm's or
    # baddbmm's factors makes the result non-finite, even where the other factor is all zeros
    # (inf * 0 is NaN). Checked against this torch's own kernels, shapes from GEMV-like to blocked.
    g = torch.Generator().manual_seed(0)
    for m, k, n in [(1, 1, 1), (3, 5, 7), (17, 300, 1), (1, 300, 17), (128, 1, 128), (64, 96, 80)]:
        for value in (float("nan"), float("inf"), float("-inf")):
            for poisoned in ("a", "b", "bias"):
                for other_zero in (False, True):
                    a, b = torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)
                    bias = torch.randn(n, generator=g).to(dtype)
                    if other_zero:
                        (b if poisoned == "a" else a).zero_()
                    t = {"a": a, "b": b, "bias": bias}[poisoned]
                    t.view(-1)[torch.randint(0, t.numel(), (), generator=g)] = value
                    results = [torch.addmm(bias, a, b), torch.baddbmm(bias.expand(2, m, n), a.expand(2, m, k),
                                                                       b.expand(2, k, n))]
                    if poisoned != "bias":
                        results += [a @ b, torch.bmm(a.expand(2, m, k), b.expand(2, k, n))]
                    for r in results:
                        assert not torch.isfinite(r).all(), (dtype, (m, k, n), value, poisoned, other_zero)


def test_a_compiled_ddp_model_is_replayed_without_ddp_and_a_peers_report_is_not(tmp_path):
    # DDP's forward and backward join its reducer's collectives: replayed on one rank in the middle
    # of DDP's own step, its reducer failed an internal assert (and with peers, they would wait).
    import torch.distributed as dist
    from types import SimpleNamespace

    from overflow_sentinel import _compiled

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        compiled = torch.compile(nn.parallel.DistributedDataParallel(model))
        w = Watch(compiled)
        x = torch.randn(8, 16)
        with w.batch():
            compiled(x).sum().backward()
        with torch.no_grad():
            model[0].weight.mul_(1e38)
        with pytest.raises(NonFiniteError) as caught:
            with w.batch():
                compiled(x).sum().backward()
        replay = caught.value.replay
        assert replay.reproduced, replay.notes
        assert not any("the replay stopped" in note for note in replay.notes)
        assert any("inside DistributedDataParallel without it" in note for note in replay.notes)
        # Another rank's inf/nan: nothing on this rank to replay.
        peer = SimpleNamespace(report=SimpleNamespace(kind="peer_nonfinite", batch_number=1))
        assert _compiled.explain(w._boundaries, peer) is None
        w.close()
    finally:
        dist.destroy_process_group()


class ScaledWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.full((16, 16), 1e-20))

    def forward(self, x):
        return x @ (self.w * 3).t()


def test_a_weight_gradient_a_compiled_kernel_overflows_in_place_is_caught():
    # The compiled backward computes w's gradient as mm(...) (2e38 here: finite) and then scales it
    # by 3 in a kernel of its own, in place in the GEMM's result buffer and without a version bump:
    # the finite read of the GEMM's result must not stand for the .grad it became (6e38: inf).
    model = ScaledWeight()
    compiled = torch.compile(model)
    w = Watch(compiled)
    x = torch.zeros(8, 16)
    x[0] = 1e19
    upstream = torch.zeros(8, 16)
    upstream[0] = 2e19
    with pytest.raises(NonFiniteError) as caught:
        with w.batch():
            (compiled(x) * upstream).sum().backward()
    assert torch.isinf(model.w.grad).all()
    trigger = caught.value.report.trigger
    assert trigger.entries[0].label == "w.grad" and trigger.entries[0].stats.pos_inf == 16 * 16
    w.close()


class AddTwice(nn.Module):
    def forward(self, x):
        return (x + 15) + 15


def _line_of_add_twice():
    import inspect
    lines, first = inspect.getsourcelines(AddTwice.forward)
    return first + next(i for i, line in enumerate(lines) if "return" in line)


def test_an_overflow_only_the_compiled_code_makes_is_said_not_reproduced(capsys):
    # fp16: eager rounds 65504 + 15 back to 65504 at each add; Inductor adds in float32 and the
    # final cast of 65534 gives inf.
    compiled = torch.compile(AddTwice())
    x = torch.full((8,), 65504.0, dtype=torch.float16)
    assert torch.isfinite(AddTwice()(x)).all()
    w = Watch(compiled)
    with pytest.raises(NonFiniteError) as caught:
        compiled(x)
    replay = caught.value.replay
    assert not replay.reproduced and replay.report is None
    assert any("float32" in note for note in replay.notes)
    # Inside the graph: its result, the second add, on the line that wrote it.
    inside = [n for n in replay.notes if n.startswith("inside the compiled graph")]
    assert inside and "add_1 (aten.add.Tensor)" in inside[0], replay.notes
    assert f"test_compiled.py:{_line_of_add_twice()}: return (x + 15) + 15" in inside[0]
    assert "stayed finite: the value was not reproduced eagerly" in capsys.readouterr().out
    w.close()


class Drop(nn.Module):
    """Dropout of one element 1e38: kept, it is 2e38, and doubled inf; dropped, 0."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x) * 2


def _seed_where_only_the_compiled_code_keeps_it(model, compiled, x):
    for seed in range(64):
        torch.manual_seed(seed)
        compiled_finite = bool(torch.isfinite(compiled(x)).all())
        torch.manual_seed(seed)
        eager_finite = bool(torch.isfinite(model(x)).all())
        if eager_finite and not compiled_finite:
            return seed
    raise AssertionError("no seed among 64 where Inductor's dropout keeps the element and eager's drops it")


def test_dropout_with_inductors_own_random_numbers_is_said_to_differ(capsys):
    model = Drop().train()
    compiled = torch.compile(model)
    x = torch.full((1,), 1e38)
    seed = _seed_where_only_the_compiled_code_keeps_it(model, compiled, x)
    w = Watch(compiled)
    torch.manual_seed(seed)
    with pytest.raises(NonFiniteError) as caught:
        compiled(x)
    replay = caught.value.replay
    assert not replay.reproduced
    assert any("draws its own random numbers" in n and "fallback_random = True" in n for n in replay.notes)
    assert "draws its own random numbers (drop is a dropout)" in capsys.readouterr().out
    w.close()


@torch._inductor.config.patch(fallback_random=True)
def test_dropout_replays_the_same_random_numbers_with_fallback_random():
    model = Drop().train()
    compiled = torch.compile(model)
    x = torch.full((1,), 1e38)

    def kept_under(seed):
        torch.manual_seed(seed)
        return not bool(torch.isfinite(compiled(x)).all())

    seed = next((s for s in range(16) if kept_under(s)), None)
    assert seed is not None, "the element is kept under no seed of 16"
    w = Watch(compiled)
    torch.manual_seed(seed)
    with pytest.raises(NonFiniteError) as caught:
        compiled(x)
    replay = caught.value.replay
    assert replay.reproduced and "aten::mul in the model's root" in replay.report.origin, replay.report.origin
    assert not any("random numbers" in n for n in replay.notes)
    w.close()


def test_inference_mode_calls_are_watched_and_replayed():
    model = tiny_t5()
    compiled = torch.compile(model)
    w = Watch(compiled)
    with torch.inference_mode():
        compiled(torch.ones(2, 8))
        plant_overflow(model)
        with pytest.raises(NonFiniteError) as caught:
            compiled(torch.ones(2, 8))
    assert caught.value.report.batch_number == 1 and caught.value.replay.reproduced
    w.close()


def test_the_replay_can_be_turned_off_and_leaves_the_model_as_it_was(capsys):
    model = tiny_t5()
    compiled = torch.compile(model)
    w = Watch(compiled, replay_compiled=False)
    error = _stop_at_batch_3(compiled, w)
    assert getattr(error, "replay", None) is None
    assert "replaying" not in capsys.readouterr().out
    w.close()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in compiled.modules())
    # Dynamo keeps no callback of ours once no watchdog is left (others of this process may live).
    from torch._dynamo.callback import callback_handler

    from overflow_sentinel import _compiled
    live = _compiled._live(_compiled._watching)
    assert w not in live
    ours = [c for c in callback_handler.start_callbacks + callback_handler.end_callbacks
            if c.__module__.startswith("overflow_sentinel")]
    assert len(ours) == (2 if live else 0)


def test_a_compiled_block_inside_an_eager_model_is_a_region_of_its_own(capsys):
    model = tiny_t5()
    model.block[1] = torch.compile(model.block[1])
    w = Watch(model)
    for _ in range(3):
        model(torch.ones(2, 8))
    plant_overflow(model)
    with pytest.raises(NonFiniteError) as caught:
        model(torch.ones(2, 8))
    assert caught.value.report.batch_number == 3
    assert caught.value.report.trigger.module_path.startswith("block.1")
    out = capsys.readouterr().out
    assert out.count("block.1 is compiled (torch.compile)") == 1
    replay = caught.value.replay
    assert replay.region == "block.1" and replay.reproduced
    assert "aten::mul in layer.0.DenseReluDense" in replay.report.origin
    w.close()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_an_op_seen_outside_the_compiled_region_is_named_without_a_replay(capsys):
    model = tiny_t5()
    model.block[1] = torch.compile(model.block[1])
    w = Watch(model)
    model(torch.ones(2, 8))
    with torch.no_grad():
        model.head.weight.fill_(3e38)  # the eager head overflows, after the compiled block ran
    with pytest.raises(NonFiniteError) as caught:
        model(torch.ones(2, 8))
    assert caught.value.report.trigger.module_path == "head"
    assert getattr(caught.value, "replay", None) is None and "replaying" not in capsys.readouterr().out
    w.close()


@pytest.mark.parametrize("options", [{"mode": "reduce-overhead"}, {"backend": "cudagraphs"}])
def test_cuda_graphs_are_named_with_what_is_read_there(capsys, options):
    compiled = torch.compile(tiny_t5(), **options)
    w = Watch(compiled)
    compiled(torch.ones(2, 8))
    out = capsys.readouterr().out
    assert "runs as CUDA graphs" in out and "max-autotune-no-cudagraphs" in out
    w.close()


@torch._inductor.config.patch(fx_graph_cache=False)
@torch._functorch.config.patch(enable_autograd_cache=False)
def test_trainer_with_torch_compile_stops_at_the_planted_step_and_replays_it(tmp_path):
    # Compiled afresh (no cache): the backward's graph is compiled inside its node's first run,
    # under the watchdog, from fake tensors that must never be read.
    pytest.importorskip("transformers")
    import contextlib
    import io

    import test_trainer as cases
    from overflow_sentinel.trainer import SentinelCallback

    trainer = cases.transformers.Trainer(model=cases.gpt2(), args=cases.arguments(tmp_path, torch_compile=True),
                                         train_dataset=cases.samples(12),
                                         callbacks=[SentinelCallback(), cases.Plant(3)])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(NonFiniteError) as caught:
        trainer.train()
    assert "compiled after it was watched" in printed.getvalue()
    assert caught.value.report.batch_number == 3
    replay = caught.value.replay
    assert replay.reproduced and "transformer.h.1.mlp.c_fc" in replay.report.origin
    assert (tmp_path / "sentinel_batch3_replay.txt").exists()


def test_a_compiled_nanogpt_that_means_its_masks_trains_under_hfs_call_as_if_unwatched():
    # As Trainer calls HF's class: no name kept, keywords. The -inf masks stay inside fused kernels.
    import test_place_rule as cases
    from nanogpt import nanogpt

    from overflow_sentinel import DebugUnderflowOverflow

    expected = cases.train(torch.compile(nanogpt()), 3)
    model = torch.compile(nanogpt())
    DebugUnderflowOverflow(model, max_frames_to_save=5)
    assert cases.train(model, 3) == expected
    watching = Watch._of_model[model._orig_mod]()
    assert watching is not None and watching.batch_number == 3 and watching.report is None
    watching.close()


class MaskedAttention(nn.Module):
    """Attention under a causal mask its forward builds with `fill` above the diagonal: compiled,
    the mask is made by one of Inductor's kernels (no op) and read by the extern attention op."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.fill = float("-inf")

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        t = x.shape[1]
        mask = torch.zeros(t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), self.fill)
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_what_the_compiled_kernels_make_for_an_extern_op_ends_there_or_is_an_error_there():
    torch.manual_seed(0)
    model = MaskedAttention()
    compiled = torch.compile(model)
    x = torch.randn(2, 6, 16)
    expected = compiled(x)
    w = Watch(compiled, exact=True)  # (extern ops are frames op by op)
    for _ in range(2):
        assert torch.equal(compiled(x), expected)
    assert w.report is None
    # Counted where the -inf ended: the attention op read 15 of them per batch.
    rows = [r for r in w.tolerated() if "scaled_dot_product" in r["op"]]
    assert len(rows) == 1 and rows[0]["frames"] == 2 and rows[0]["neg_inf"] == 2 * 15, w.tolerated()
    # A NaN the kernels make, which the attention passes on: an error at the attention op.
    model.fill = float("nan")
    with pytest.raises(NonFiniteError) as caught:
        compiled(x)
    trigger = caught.value.report.trigger
    assert "scaled_dot_product" in trigger.op
    assert any(e.role == "input" and e.stats.nan > 0 for e in trigger.entries)
    w.close()


def test_the_call_compiled_after_watching_is_not_judged_and_the_next_ones_are():
    # The call that compiles runs its kernels with no boundary around them: in a batch opened by
    # the loop (as Trainer's callback opens its steps), its extern attention, reading the mask they
    # made, would be an op outside any compiled call.
    torch.manual_seed(0)
    model = MaskedAttention()
    w = Watch(model, exact=True)  # (extern ops are frames op by op)
    compiled = torch.compile(model)
    x = torch.randn(2, 6, 16)
    for _ in range(3):
        with w.batch():
            compiled(x)
    assert w.report is None
    rows = [r for r in w.tolerated() if "scaled_dot_product" in r["op"]]
    assert len(rows) == 1 and rows[0]["frames"] == 2, w.tolerated()
    model.fill = float("nan")  # recompiled: the boundary is there, and the NaN stops it
    with pytest.raises(NonFiniteError) as caught:
        with w.batch():
            compiled(x)
    assert "scaled_dot_product" in caught.value.report.trigger.op
    w.close()
