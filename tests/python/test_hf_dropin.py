"""overflow_sentinel.DebugUnderflowOverflow as a drop-in for Hugging Face's class."""

import os

import pytest
import torch

import overflow_sentinel
from overflow_sentinel import DebugUnderflowOverflow, NonFiniteError, AbortAfterBatch

from models import SqrtHead, line_of, plant_overflow, tiny_t5
from tiers import both_tiers, named


@both_tiers
def test_the_first_overflow_is_reported_in_hfs_layout_and_raised_as_a_value_error(capsys, tier):
    model = tiny_t5()
    debug = DebugUnderflowOverflow(model)
    model(torch.ones(2, 8))  # batch 0: clean
    plant_overflow(model, block=1)
    with pytest.raises(ValueError) as caught:
        model(torch.ones(2, 8))  # batch 1
    error = caught.value
    assert isinstance(error, NonFiniteError)
    out = capsys.readouterr().out
    assert "Detected inf/nan during batch_number=1" in out
    assert "Last 21 forward frames:" in out
    report = named(error)
    assert report.batch_number == 1
    assert 10 < len(report.frames) <= 21
    # The mul written between the two projections makes the inf; wo, inside the same module, reads
    # it, and the report stops where the inf leaves wo (its forward returns it), as HF's does.
    trigger = report.trigger
    assert trigger.op == "return"
    assert trigger.module_path == "block.1.layer.0.DenseReluDense.wo"
    assert trigger.module_class == "Linear"
    assert report.escape == "returned"
    made = report.origin_frame
    assert made.op == "aten::mul"
    assert made.module_path == "block.1.layer.0.DenseReluDense"
    assert made.module_class == "T5DenseGatedGeluDense"
    assert made.direction == "forward"
    # Its inputs were finite: the mul made the inf, and the origin line says so.
    assert not report.produced_here
    assert "aten::mul in block.1.layer.0.DenseReluDense" in report.origin
    assert "produced the first inf/nan" in report.origin and "returned it from its forward" in report.origin
    inputs = [e for e in made.entries if e.role == "input"]
    assert len(inputs) == 2 and all(e.stats.pos_inf == 0 for e in inputs)
    assert [e for e in made.entries if e.role == "output"][0].stats.pos_inf > 0
    returned = [e for e in trigger.entries if e.role == "output"][0].stats
    assert returned.nan + returned.pos_inf + returned.neg_inf > 0
    # The Python line where it left: the call of wo.
    first = report.python_stack[0]
    assert f"models.py:{line_of('LEAVES_LINE')}:" in first, report.python_stack
    assert "self.wo(hidden_states)" in first
    assert "Python call stack at detection" in error.text
    # strict=True stops at the mul itself, on its own line.
    debug.close()
    strict = DebugUnderflowOverflow(model, strict=True)
    with pytest.raises(ValueError) as caught:
        model(torch.ones(2, 8))
    strictly = named(caught.value)
    assert strictly.trigger.op == "aten::mul"
    assert strictly.produced_here and strictly.origin_frame is None
    assert f"models.py:{line_of('OVERFLOW_LINE')}:" in strictly.python_stack[0]
    strict.close()
    # The parameters a frame uses carry their names and role.
    wi_0 = [f for f in report.frames if f.module_path == "block.1.layer.0.DenseReluDense.wi_0"]
    assert wi_0 and any(e.label == "weight" and e.role == "parameter" for e in wi_0[-1].entries)
    debug.close()


def test_a_clean_batch_raises_nothing_and_batches_count_from_zero():
    model = tiny_t5()
    debug = DebugUnderflowOverflow(model)
    for _ in range(3):
        model(torch.randn(2, 8))
    assert debug.batch_number == 3
    assert debug.report is None
    frames = debug.saved_frames()
    assert 0 < len(frames) <= 21
    assert all(f.batch_number == 2 for f in frames[-3:])
    debug.close()


def test_trace_mode_prints_the_traced_batches_frames(capsys):
    model = tiny_t5()
    debug = DebugUnderflowOverflow(model, trace_batch_nums=[1, 2])
    for _ in range(4):
        model(torch.ones(2, 8))
    out = capsys.readouterr().out
    assert "*** Starting batch number=0 ***" not in out
    assert "*** Starting batch number=1 ***" in out and "*** Starting batch number=2 ***" in out
    assert "*** Starting batch number=3 ***" not in out
    assert "block.1.layer.0.DenseReluDense T5DenseGatedGeluDense aten::mul" in out
    debug.close()


def test_abort_after_batch_num_stops_after_that_batch():
    model = tiny_t5()
    debug = DebugUnderflowOverflow(model, abort_after_batch_num=1)
    model(torch.ones(2, 8))
    with pytest.raises(ValueError) as caught:
        model(torch.ones(2, 8))
    assert isinstance(caught.value, AbortAfterBatch)
    assert "aborting after batch 1" in str(caught.value)
    debug.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_a_nan_in_the_backward_is_caught_at_its_node_with_the_forward_module(device):
    model = SqrtHead().to(device)
    debug = DebugUnderflowOverflow(model, exact=True)  # (a backward inf that reaches no .grad: exact mode's, test_boundary_tier.py)
    out = model(torch.ones(2, 4, device=device, requires_grad=True))
    assert torch.equal(out, torch.zeros(2, 4, device=device))
    with pytest.raises(NonFiniteError) as caught:
        out.sum().backward()
    trigger = caught.value.report.trigger
    assert trigger.direction == "backward"
    assert trigger.op == "SqrtBackward0"
    assert trigger.forward_op == "aten::sqrt"
    assert trigger.module_class == "SqrtHead"
    assert "Detected inf/nan during batch_number=0" in caught.value.text
    debug.close()


def test_gradients_of_the_parameters_are_checked_after_backward():
    model = tiny_t5()
    debug = DebugUnderflowOverflow(model)
    out = model(torch.ones(2, 8))
    # A gradient made inf by a hook that LibTorch runs outside any op: only the .grad check sees it.
    model.head.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    with pytest.raises(NonFiniteError) as caught:
        out.sum().backward()
    trigger = caught.value.report.trigger
    assert trigger.module_path == "head"
    # The check of the parameters' gradients, not an op: the gradient entry named by parameter.
    assert trigger.op == "AccumulateGrad"
    assert any(e.label == "weight.grad" and e.role == "gradient" and e.stats.pos_inf > 0 for e in trigger.entries)
    debug.close()


def test_watched_outputs_and_gradients_equal_unwatched_ones_bit_for_bit():
    x = torch.randn(4, 8)

    def step(model):
        model.zero_grad()
        out = model(x)
        out.pow(2).sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    model = tiny_t5(seed=3)
    out_plain, grads_plain = step(model)
    debug = DebugUnderflowOverflow(model)
    out_watched, grads_watched = step(model)
    debug.close()
    assert torch.equal(out_plain, out_watched)
    assert all(torch.equal(a, b) for a, b in zip(grads_plain, grads_watched))


def test_a_training_loop_with_an_optimizer_runs_as_unwatched_and_counts_its_batches():
    def train(watched):
        model = tiny_t5(seed=5)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        debug = DebugUnderflowOverflow(model) if watched else None
        torch.manual_seed(11)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if debug:
            assert debug.batch_number == 5
            debug.close()
        return losses, [p.detach().clone() for p in model.parameters()]

    losses_plain, params_plain = train(False)
    losses_watched, params_watched = train(True)
    assert losses_plain == losses_watched
    assert all(torch.equal(a, b) for a, b in zip(params_plain, params_watched))


@both_tiers
def test_reports_are_written_as_txt_json_and_html(tmp_path, tier):
    model = tiny_t5()
    plant_overflow(model)
    with overflow_sentinel.watch(model, report_dir=tmp_path):
        with pytest.raises(NonFiniteError) as caught:
            model(torch.ones(2, 8))
        assert named(caught.value).origin_frame.op == "aten::mul"
    names = sorted(os.listdir(tmp_path))
    assert {"sentinel_batch0.txt", "sentinel_batch0.json", "sentinel_batch0.html"} <= set(names)
    report = overflow_sentinel.Report.from_json((tmp_path / "sentinel_batch0.json").read_text())
    assert report.python_stack and "self.wo(hidden_states)" in report.python_stack[0]
    if tier == "exact":
        assert report.origin_frame.op == "aten::mul" and report.escape == "returned"
        return
    # The boundary's report in the files, the replay's beside it, naming the op.
    assert report.trigger.op == "forward" and report.trigger.module_path == "block.1.layer.0.DenseReluDense.wo"
    replayed = (tmp_path / "sentinel_batch0_replay.txt").read_text()
    assert "aten::mul in block.1.layer.0.DenseReluDense" in replayed


@both_tiers
def test_warn_keeps_running_and_the_callback_gets_the_report(tier):
    model = tiny_t5()
    plant_overflow(model)
    seen = []
    debug = DebugUnderflowOverflow(model, callback=seen.append)
    model(torch.ones(2, 8))
    model(torch.ones(2, 8))
    # The first inf/nan of each batch, as in C++; the run goes on.
    assert [r.batch_number for r in seen] == [0, 1]
    assert all(r.text.startswith("Detected inf/nan") for r in seen)
    if tier == "exact":
        assert all(r.origin_frame.op == "aten::mul" for r in seen)
    else:  # nothing is raised, so nothing is replayed: the boundary's report, of the module that returned it
        assert all(r.trigger.op == "forward" and r.trigger.module_path == "block.1.layer.0.DenseReluDense.wo"
                   for r in seen)
    debug.close()
    model2 = tiny_t5()
    plant_overflow(model2)
    debug = DebugUnderflowOverflow(model2, action="warn")
    model2(torch.ones(2, 8))
    assert debug.report.batch_number == 0
    debug.close()


def test_an_explicit_batch_holds_a_whole_training_step():
    model = SqrtHead()
    w = overflow_sentinel.Watch(model, exact=True)  # (a backward inf that reaches no .grad: exact mode's, test_boundary_tier.py)
    with pytest.raises(NonFiniteError) as caught:
        with w.batch():
            model(torch.ones(2, 4)).sum().backward()
    assert caught.value.report.trigger.op == "SqrtBackward0"
    assert caught.value.report.batch_number == 0
    w.close()


@both_tiers
def test_a_model_run_on_another_python_thread_is_watched_there(tier):
    import threading

    model = tiny_t5()
    plant_overflow(model)
    debug = DebugUnderflowOverflow(model)
    caught = []

    def run():
        try:
            model(torch.ones(2, 8))
        except NonFiniteError as error:
            caught.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert len(caught) == 1 and named(caught[0]).origin_frame.op == "aten::mul"
    assert any("self.wo(hidden_states)" in line for line in named(caught[0]).python_stack)
    # The main thread's own calls are watched as before.
    with pytest.raises(NonFiniteError):
        model(torch.ones(2, 8))
    debug.close()


class TiedLm(torch.nn.Module):
    """An embedding and an output head that share one weight, and a class token concatenated in
    front of the tokens, as GPT-2's and ViT's are."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.cls = torch.nn.Parameter(torch.full((1, 1, 4), 0.5))

    def forward(self, ids):
        x = self.emb(ids)
        x = torch.cat([self.cls.expand(ids.shape[0], -1, -1), x], dim=1)
        return self.head(x)


def test_a_tied_weight_belongs_to_the_module_running_the_op_and_a_listed_parameter_is_named():
    model = TiedLm()
    w = overflow_sentinel.Watch(model, exact=True)  # (op frames)
    model(torch.tensor([[1, 2, 3]]))
    frames = w.saved_frames()
    w.close()
    by_op = {f.op: f for f in frames}
    # The shared weight read by the embedding is the embedding's; by the linear, the head's.
    assert by_op["aten::embedding"].module_path == "emb"
    assert by_op["aten::linear"].module_path == "head"
    assert any(e.label == "weight" and e.role == "parameter" for e in by_op["aten::embedding"].entries)
    assert any(e.label == "weight" and e.role == "parameter" for e in by_op["aten::linear"].entries)
    # The class token, expanded and handed to cat in a list, is still a parameter by its name.
    cat = by_op["aten::cat"]
    token = [e for e in cat.entries if e.label == "cls"]
    assert len(token) == 1 and token[0].role == "parameter"
    assert token[0].stats.abs_min == token[0].stats.abs_max == 0.5
