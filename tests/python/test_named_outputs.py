"""What HF's class prints as "not a tensor" in a module's arguments or result (a dict, a list, an
object such as a cache): ours reads the tensors inside, each named by the path that reaches it from
Python, in a frame of the module (op "call" or "return"). The place rule judges them as what the
module was handed or returned; odd tensors inside are skipped and labelled; odd objects (cycles)
cost a bounded walk."""

import contextlib
import io

import pytest
import torch
from torch import nn

from overflow_sentinel import DebugUnderflowOverflow, NonFiniteError
from tiers import both_tiers, named


class Store:
    """A cache-like object: tensors in attributes and in a list of objects."""

    def __init__(self, *tensors):
        self.layers = [Layer(t) for t in tensors]
        self.steps = len(tensors)
        self._private = torch.full((2,), float("nan"))  # not public: never read


class Layer:
    def __init__(self, t):
        self.keys = t
        self.values = t * 2


class ReturnsContainers(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        h = self.proj(x)
        return {"hidden": h, "parts": [h * 3, None, 7], "store": Store(h + 1, h - 1)}


class TakesAStore(nn.Module):
    def forward(self, x, store):
        return x + store.layers[0].keys


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = ReturnsContainers()
        self.reader = TakesAStore()
        self.again = TakesAStore()

    def forward(self, x):
        out = self.inner(x)
        y = self.reader(out["hidden"], out["store"])
        return self.again(y, out["store"])


def reach(value, label):
    root = label.split("[", 1)[0].split(".", 1)[0]
    return eval(label, {root: value})  # noqa: S307 - the test's own labels


def test_tensors_inside_dicts_lists_and_objects_are_read_and_named_by_their_path():
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(3, 4)
    seen = {}
    model.inner.register_forward_hook(lambda m, args, out: seen.setdefault("output", out))
    model.reader.register_forward_pre_hook(lambda m, args: seen.setdefault("input", args))
    debug = DebugUnderflowOverflow(model, max_frames_to_save=1000, exact=True)  # (the return and call frames of ops' modules)
    with torch.no_grad():
        watched = model(x)
    frames = debug.saved_frames()
    debug.close()
    with torch.no_grad():
        assert torch.equal(watched, model(x))  # watching changes nothing

    returned = [f for f in frames if f.op == "return" and f.module_path == "inner"]
    assert len(returned) == 1
    labels = [e.label for e in returned[0].entries]
    assert labels == ["output['hidden']", "output['parts'][0]", "output['store'].layers[0].keys",
                      "output['store'].layers[0].values", "output['store'].layers[1].keys",
                      "output['store'].layers[1].values"]
    called = [f for f in frames if f.op == "call"]
    # The store handed to `reader` is read there; handed unchanged to `again`, not read twice.
    assert [f.module_path for f in called] == ["reader"]
    assert [e.label for e in called[0].entries] == ["input[1].layers[0].keys", "input[1].layers[0].values",
                                                    "input[1].layers[1].keys", "input[1].layers[1].values"]
    for f, side in ((returned[0], "output"), (called[0], "input")):
        for e in f.entries:
            t = reach(seen[side], e.label).double().abs()
            assert (e.stats.abs_min, e.stats.abs_max) == (t.min().item(), t.max().item()), e.label


@both_tiers
def test_a_cache_too_big_for_one_frame_fills_several_in_order(tier):
    class ManyLayers(nn.Module):
        def forward(self, x):
            return Store(*[x + i for i in range(20)])  # 40 tensors

    model = ManyLayers()
    debug = DebugUnderflowOverflow(model, max_frames_to_save=1000)
    model(torch.ones(2))
    # Op by op, the module's return; at module boundaries, its forward's frames (the first also
    # shows what it was handed).
    frames = [f for f in debug.saved_frames() if f.op == ("return" if tier == "exact" else "forward")]
    debug.close()
    labels = [e.label for f in frames for e in f.entries if e.role == "output"]
    assert len(frames) == 3
    assert labels == [f"output.layers[{i}].{part}" for i in range(20) for part in ("keys", "values")]
    assert [e.stats.abs_max for f in frames for e in f.entries][-1] == 2 * (1 + 19)


@both_tiers
def test_a_tolerated_value_returned_inside_a_dict_stops_at_the_return_naming_its_key(tier):
    class MaskInADict(nn.Module):
        def forward(self, n: int):
            return {"mask": torch.full((n, n), float("-inf")).triu(1), "n": n}

    class Uses(nn.Module):
        def __init__(self):
            super().__init__()
            self.maker = MaskInADict()

        def forward(self, x):
            return (x + self.maker(x.shape[-1])["mask"]).softmax(-1)

    model = Uses()
    debug = DebugUnderflowOverflow(model)
    with pytest.raises(NonFiniteError) as caught:
        model(torch.randn(4, 4))
    if tier == "boundary":  # the module's frame names the key too
        assert [e.label for e in caught.value.report.trigger.entries if e.role == "output"] == ["output['mask']"]
    report = named(caught.value)
    debug.close()
    assert (report.trigger.module_path, report.trigger.op, report.escape) == ("maker", "return", "returned")
    assert [e.label for e in report.trigger.entries] == ["output['mask']"]
    assert report.origin_frame.op in ("aten::full", "aten::triu")
    # The entry's label is what allow_nonfinite names.
    allowed = DebugUnderflowOverflow(model, allow_nonfinite=["maker return output['mask']"])
    assert torch.isfinite(model(torch.randn(4, 4))).all()
    # (counted under the module's frame: its return in exact mode, its forward at its boundaries)
    assert [r["op"] for r in allowed.tolerated() if r["allowed"]] == ["return" if tier == "exact" else "forward"]
    allowed.close()


def test_odd_tensors_inside_are_skipped_and_labelled_and_a_cycle_costs_a_bounded_walk():
    class Odd(nn.Module):
        def forward(self, x):
            node = Layer(x)
            node.next = node  # a cycle
            return {"ints": torch.arange(3), "meta": torch.empty(2, device="meta"), "empty": x[:0],
                    "sparse": torch.eye(2).to_sparse(), "complex": torch.ones(2, dtype=torch.complex64),
                    "node": node}

    model = Odd()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        debug = DebugUnderflowOverflow(model, max_frames_to_save=1000, trace_batch_nums=[0])
        model(torch.ones(2))
        frames = [f for f in debug.saved_frames() if f.op == "return"]
        debug.close()
    entries = {e.label: e for f in frames for e in f.entries}
    for label in ("output['meta']", "output['empty']", "output['sparse']", "output['complex']"):
        assert entries[label].skip_reason, label
    assert entries["output['node'].keys"].stats.abs_max == 1
    assert "output['node'].next.next.keys" in entries  # bounded: a few levels, then no more
    assert not any(label.count(".next") > 8 for label in entries)
    assert "output['node'].keys" in printed.getvalue()  # a traced batch prints the named frame
