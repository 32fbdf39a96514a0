"""With action "warn" or "callback", which raise nothing, the boundary tier still names the op: the
batch is replayed once the watchdog's native call that delivered the report has returned, the
replay's report printed after the boundary's, a callback handed the report with its `.replay`;
once per place, however many batches find it again."""

import threading

import torch

from overflow_sentinel import Watch

from models import SqrtOfZero, plant_overflow, tiny_t5


def forward_overflow(exact, **options):
    model = tiny_t5()
    plant_overflow(model, block=1)
    w = Watch(model, exact=exact, **options)
    try:
        for _ in range(3):
            model(torch.ones(2, 8))
    finally:
        w.close()


def backward_inf(exact, **options):
    model = SqrtOfZero()
    w = Watch(model, exact=exact, **options)
    try:
        for _ in range(2):
            model(torch.ones(3, 4)).sum().backward()
            model.zero_grad()
    finally:
        w.close()


def origin_of(report):
    made = report.origin_frame or report.trigger
    return made.op, made.module_path, made.direction


def test_a_callback_gets_the_report_with_the_replay_that_names_exact_modes_op():
    exact, boundary = [], []
    forward_overflow(True, callback=exact.append)
    forward_overflow(False, callback=boundary.append)
    assert len(boundary) == 3 and len(exact) == 3  # one report a batch, each handed over
    first = boundary[0]
    assert (first.trigger.op, first.trigger.module_path) == ("forward", "block.1.layer.0.DenseReluDense.wo")
    assert first.replay.reproduced
    assert origin_of(first.replay.report) == origin_of(exact[0]) == ("aten::mul", "block.1.layer.0.DenseReluDense",
                                                                      "forward")
    # The same place found again in the next batches: not replayed again.
    assert all(getattr(r, "replay", None) is None for r in boundary[1:])


def test_warn_prints_the_replay_after_the_boundarys_report_once_per_place(capsys):
    forward_overflow(False, action="warn")
    out = capsys.readouterr().out
    assert out.count("Detected inf/nan during batch_number=") == 4  # three batches, one replay
    assert out.count("replaying batch 0 under op-level watching") == 1
    assert out.index("replaying batch 0") < out.rindex("Detected inf/nan during batch_number=0")
    assert "aten::mul in block.1.layer.0.DenseReluDense made it at" in out


def test_a_backward_inf_delivered_by_a_callback_is_replayed_with_its_backward():
    exact, boundary = [], []
    backward_inf(True, callback=exact.append)
    backward_inf(False, callback=boundary.append)
    first = boundary[0]
    assert (first.trigger.op, first.trigger.module_path) == ("AccumulateGrad", "lin")
    assert first.replay.reproduced and "SqrtBackward0" in first.replay.report.origin
    assert first.replay.report.origin == exact[0].origin
    assert all(getattr(r, "replay", None) is None for r in boundary[1:])


def test_a_watchdog_made_inside_the_backwards_final_callback_watches_ops_after_the_backward():
    """A replay of a backward's report runs inside the autograd engine's final callback, where a
    thread-local op callback added is dropped by LibTorch when the backward returns (the engine puts
    the thread's state back): a watchdog made there must still see every op once it has."""
    found = []

    def run():
        other = tiny_t5()
        plant_overflow(other, block=1)
        made = []
        x = torch.ones(2, requires_grad=True)
        x.register_hook(lambda grad: torch.autograd.Variable._execution_engine.queue_callback(
            lambda: made.append(Watch(other, exact=True, callback=found.append))))
        (x * 2).sum().backward()
        other(torch.ones(2, 8))
        made[0].close()

    thread = threading.Thread(target=run)  # (a thread of its own: the callbacks are per thread)
    thread.start()
    thread.join()
    assert len(found) == 1 and found[0].origin_frame.op == "aten::mul"


def test_a_replay_that_fails_leaves_the_report_to_the_callback_and_says_why(monkeypatch, capsys):
    import overflow_sentinel._explained as explained

    def broken(watch, delivered):
        raise RuntimeError("no memory left")

    monkeypatch.setattr(explained, "explain", broken)
    got = []
    forward_overflow(False, callback=got.append)
    assert len(got) == 3 and all(getattr(r, "replay", None) is None for r in got)
    assert "batch 0 could not be replayed: RuntimeError: no memory left" in capsys.readouterr().out
