"""compare(): the reference in float64, the reference in the candidate's precision (the baseline),
then the candidate, read at every mapped module boundary; the first module whose output departs
beyond its tolerance while its input agreed, confirmed by running that module alone on the
reference's input; then the backward, seeded alike on both sides, judged once the forward agrees."""

import contextlib
import copy
import time

import torch

from . import mapping as mapping_
from . import preflight, recipes
from .hooks import ModuleStack, Recorder, primary_output, read_at, replace_at
from .float64 import Float64Everywhere
from .report import CompareResult
from .store import DEFAULT_CAP_BYTES, SpillStore
from .tolerance import Tolerance, error, format_name, metrics


class _MappingError(ValueError):
    """A boundary's tensors that no transform given reconciles: raised from inside a hook, passed on as is."""


def _cast_inputs(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _cast_inputs(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_inputs(v, dtype) for v in value)
    return value


def _copy_in(model, dtype, every_buffer):
    """A copy of `model` whose floating parameters (and persistent buffers, or with `every_buffer`
    all) are `dtype`. A model made in a low precision keeps its computed constants as they were
    made (Llama's non-persistent `inv_freq` stays float32 when transformers loads it in bfloat16):
    the baseline does the same, or it would pay for a rounding the candidate never makes."""
    copied = copy.deepcopy(model)
    persistent = set(copied.state_dict(keep_vars=True))
    for module_path, module in copied.named_modules():
        for name, value in list(module.named_parameters(recurse=False)):
            if value.is_floating_point():
                value.data = value.data.to(dtype)
            value.grad = None
        for name, value in list(module.named_buffers(recurse=False)):
            full = f"{module_path}.{name}" if module_path else name
            if value is not None and value.is_floating_point() and (every_buffer or full in persistent):
                module._buffers[name] = value.to(dtype)
    return copied


def _float_dtype(model, side):
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    for b in model.buffers():
        if b.is_floating_point():
            return b.dtype
    raise ValueError(f"overflow_sentinel: the {side} has no floating-point parameter to take its precision from")


class _Side:
    """One model of the compare and how it is called."""

    def __init__(self, name, model, inputs, context):
        self.name, self.model, self.inputs, self.context = name, model, inputs, context

    def call(self, seed, stack=None):
        """The model's output on its inputs, with the same random state every time; an exception
        from the model becomes a ValueError naming the side and the module it was in."""
        with torch.random.fork_rng(devices=[]), self.context():
            torch.manual_seed(seed)
            try:
                if isinstance(self.inputs, dict):
                    return self.model(**self.inputs)
                if isinstance(self.inputs, (list, tuple)):
                    return self.model(*self.inputs)
                return self.model(self.inputs)
            except _MappingError:
                raise
            except Exception as e:
                where = f" in module {stack.innermost()!r}" if stack is not None and stack.innermost() else ""
                raise ValueError(f"overflow_sentinel: the {self.name} rejects the inputs{where}: "
                                 f"{type(e).__name__}: {e}") from e


def _members(model, pairs, reference_side):
    """(module, [(pair index, member index)]) for the pairs' modules of one side."""
    modules = dict(model.named_modules()) if reference_side else mapping_.candidate_modules(model)[0]
    roles = {}
    for i, pair in enumerate(pairs):
        if not pair.compared:
            continue
        paths = pair.reference if reference_side else [pair.candidate]
        for member, path in enumerate(paths):
            roles.setdefault(path, []).append((i, member))
    return [(modules[path], r) for path, r in roles.items()]


def _parameter_grads(model, pairs, reference_side, names):
    """(pair, 'p:<name>') -> the gradient of each pair's parameters, in the candidate's form."""
    modules = dict(model.named_modules()) if reference_side else mapping_.candidate_modules(model)[0]
    grads = {}
    for i, pair in enumerate(pairs):
        if not pair.compared:
            continue
        for name in names[i]:
            paths = pair.reference if reference_side else [pair.candidate]
            params = [dict(modules[p].named_parameters(recurse=False)).get(name) for p in paths]
            parts = [getattr(p, "grad", None) for p in params]
            if not reference_side and parts[0] is None and params[0] is not None:
                # No gradient reached the candidate's parameter (detached, or frozen) where the
                # reference's got one: judged as a zero gradient, which differs by all of it.
                parts = [torch.zeros_like(params[0])]
            if any(g is None for g in parts):
                continue
            value = parts[0] if not reference_side else (
                pair.weight(parts) if pair.weight is not None else parts[0])
            grads[(i, 0, "p:" + name)] = value.detach()
    return grads


def compare(reference, candidate, inputs, mapping=None, *, candidate_inputs=None, activation=None,
            autocast=None, recipe=None, multiple=None, floor=None, backward=True, seed=0,
            memory_cap_bytes=DEFAULT_CAP_BYTES, spill_dir=None, check_repeatable=True, report=None):
    """Compare `candidate` (a port) with `reference` module by module on `inputs` (a dict of
    keyword arguments, a tuple of positional ones, or one tensor; `candidate_inputs` when the port
    takes other ones) and name the first module that diverges, forward or backward. `mapping` is a
    list of Rule; identical paths match by themselves. `activation` is the transform that brings
    the reference's activations to the candidate's layout where a rule gives none. The candidate's
    precision is its parameters' dtype, `autocast` (a dtype it runs under) and `recipe`
    ('mxfp8', 'mxfp8_e5m2', 'mxfp4': block-scaled casts its linear layers apply); `multiple` and `floor`
    override the tolerance's. Returns a CompareResult; `report` (a path ending .json, .txt or
    .html) also writes it. docs/compare.md says how it judges."""
    for name, model in (("reference", reference), ("candidate", candidate)):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"overflow_sentinel: compare's {name} is a torch.nn.Module, not {type(model).__name__}")
    if mapping is not None and not isinstance(mapping, (list, tuple)):
        raise TypeError(f"overflow_sentinel: compare's mapping is a list of Rule, not {type(mapping).__name__}")
    pairs, only_candidate, only_reference, boundaries, inside = mapping_.resolve(
        candidate, reference, list(mapping or []), activation)
    compared = [p for p in pairs if p.compared]
    if not compared:
        raise ValueError("overflow_sentinel: compare found no module pair to compare: give a mapping "
                         f"(candidate modules: {list(mapping_.candidate_modules(candidate)[0])[:6]}, ...)")
    weights_checked = mapping_.check_weights(pairs, candidate, reference)

    cand_dtype = _float_dtype(candidate, "candidate")
    if recipe is not None:
        fmt = recipes.recipe_format(recipe)
    else:
        fmt = format_name(autocast if autocast is not None else cand_dtype)
    tolerance = Tolerance(fmt, multiple, floor)
    device = next(candidate.parameters()).device.type
    context = (lambda: torch.autocast(device, dtype=autocast)) if autocast is not None else contextlib.nullcontext
    cand_inputs = inputs if candidate_inputs is None else candidate_inputs
    findings = []
    preflight.check_inputs(inputs, cand_inputs, findings)
    root = next((i for i, p in enumerate(pairs) if p.candidate == "" and p.compared), None)
    seed_transform = pairs[root].output if root is not None else (
        mapping_.Transform(activation, "activation") if activation is not None else None)

    store = SpillStore(memory_cap_bytes, spill_dir)
    names = [list(dict(mapping_.candidate_modules(candidate)[0][p.candidate].named_parameters(recurse=False)))
             for p in pairs]
    seconds, clock = {}, [time.perf_counter()]

    def lap(name):
        now = time.perf_counter()
        seconds[name] = round(now - clock[0], 4)
        clock[0] = now
    try:
        with preflight.settled(reference, candidate, findings):
            shapes = _check_runs(reference, candidate, inputs, cand_inputs, pairs, context, seed,
                                 check_repeatable, findings)
            lap("pre-flight runs")
            ref64 = _copy_in(reference, torch.float64, every_buffer=True)
            oracle = _Side("reference in float64", ref64, _cast_inputs(inputs, torch.float64), Float64Everywhere)
            gradient = _run_reference(oracle, pairs, names, seed, backward, lambda k, t: store.put(k, t.double()),
                                      None)
            lap("reference in float64")
            baseline_model = _copy_in(reference, cand_dtype, every_buffer=False)
            if recipe is not None:
                recipes.apply_recipe(baseline_model, recipe)
            base_side = _Side("reference in the candidate's precision", baseline_model,
                              _cast_inputs(inputs, cand_dtype), context)
            baseline = {}

            def judge_baseline(key, value):
                reference_value = store.get(key)
                if reference_value is not None:
                    baseline[key] = error(value, reference_value, tolerance.range_relative)
            _run_reference(base_side, pairs, names, seed, backward, judge_baseline, gradient)
            lap("baseline")
            del ref64, baseline_model, oracle, base_side
            rows, order, first, confirmation = _run_candidate(
                _Side("candidate", candidate, cand_inputs, context), pairs, names, store, baseline, tolerance,
                seed, backward, gradient, seed_transform, shapes)
            lap("candidate")
    finally:
        store_info = store.as_dict()
        store.close()
    result = CompareResult(
        pairs=pairs, rows=rows, order=order, first=first, confirmation=confirmation, tolerance=tolerance,
        only_candidate=only_candidate, only_reference=only_reference,
        suggestions=mapping_.suggest(only_candidate, only_reference, candidate, reference),
        findings=findings, memory=store_info, weights_checked=weights_checked, backward=backward,
        precision={"dtype": str(cand_dtype).replace("torch.", ""),
                   "autocast": str(autocast).replace("torch.", "") if autocast is not None else None,
                   "recipe": recipe},
        compiled={"boundaries": sorted(boundaries), "inside": len(inside)}, seconds=seconds)
    if report is not None:
        result.write(report)
    return result


def _check_runs(reference, candidate, inputs, cand_inputs, pairs, context, seed, check_repeatable, findings):
    """Each model once as it is (the candidate twice): inputs a model rejects, boundaries whose
    shapes no transform reconciles and a candidate that does not repeat itself are found here,
    before the long runs. Returns the reference's boundary shapes in the candidate's form."""
    shapes = {}
    with torch.no_grad():
        ref_stack = ModuleStack(reference.named_modules())
        recorder = Recorder(_members(reference, pairs, True), pairs, True,
                            lambda i, c, k, t: shapes.__setitem__((i, c, k), tuple(t.shape)))
        try:
            _Side("reference", reference, inputs, contextlib.nullcontext).call(seed, ref_stack)
        finally:
            recorder.remove()
            ref_stack.remove()

        def check(i, call, kind, tensor):
            want = shapes.get((i, call, kind))
            if want is not None and want != tuple(tensor.shape):
                pair = pairs[i]
                transform = pair.output if kind == "out" else pair.input
                how = f"after {transform.spec!r}" if transform is not None else "as it is"
                raise _MappingError(
                    f"overflow_sentinel: shapes no transform reconciles at {pair.label()} ({kind}put, call {call}): "
                    f"the candidate's {list(tensor.shape)} against the reference's {list(want)} {how}; give the "
                    f"rule an output=/input=/activation= transform, or map only the enclosing module")
        modules, _, inside = mapping_.candidate_modules(candidate)
        cand_stack = ModuleStack((p, m) for p, m in modules.items() if p not in inside)
        recorder = Recorder(_members(candidate, pairs, False), pairs, False, check)
        side = _Side("candidate", candidate, cand_inputs, context)
        try:
            first = primary_output(side.call(seed, cand_stack))
        finally:
            recorder.remove()
            cand_stack.remove()
        if check_repeatable and first is not None:
            again = primary_output(side.call(seed))
            if not torch.equal(first, again):
                findings.append("repeatability: the candidate gave another output on the same inputs and seed "
                                f"(largest difference {float((first.double() - again.double()).abs().max()):.3e}): "
                                "something stateful, random or nondeterministic runs in it, and may make a false difference")
            else:
                findings.append("repeatability: the candidate repeats its output bit for bit on the same inputs and seed")
    return shapes


def _run_reference(side, pairs, names, seed, backward, emit, gradient):
    """Forward (and backward, seeded with `gradient`, or a seeded random one made here and
    returned) of a reference-side model, every boundary tensor passed to emit((pair, call, kind),
    tensor)."""
    recorder = Recorder(_members(side.model, pairs, True), pairs, True, lambda i, c, k, t: emit((i, c, k), t))
    try:
        with torch.enable_grad():
            y = primary_output(side.call(seed))
        if backward and y is not None and y.requires_grad:
            if gradient is None:
                generator = torch.Generator().manual_seed(seed)
                gradient = torch.randn(y.shape, generator=generator, dtype=torch.float64)
            with side.context():
                y.backward(gradient.to(device=y.device, dtype=y.dtype))
            for key, value in _parameter_grads(side.model, pairs, True, names).items():
                emit(key, value)
    finally:
        recorder.remove()
    return gradient


def _run_candidate(side, pairs, names, store, baseline, tolerance, seed, backward, gradient, seed_transform,
                   shapes):
    """The candidate's forward, each boundary judged as it is made; its first divergence run
    alone on the reference's input; then its backward when the forward agreed."""
    rows, calls, captured = {}, {}, {}
    first = []

    def row(i, call):
        return rows.setdefault((i, call), {"pair": i, "call": call, "forward": {}, "backward": {}})

    def emit(i, call, kind, tensor):
        key = (i, call, kind)
        reference_value = store.get(key)
        if reference_value is None:
            return
        if tuple(reference_value.shape) != tuple(tensor.shape):
            raise _MappingError(f"overflow_sentinel: shapes no transform reconciles at {pairs[i].label()}: "
                                f"{list(tensor.shape)} against {list(reference_value.shape)} ({kind})")
        base = baseline.get(key)
        limit = tolerance.of(base)
        found = metrics(tensor, reference_value, limit, tolerance.range_relative)
        found.update({"baseline": base, "tolerance": limit})
        direction = "forward" if kind in ("in", "out") else "backward"
        row(i, call)[direction][kind] = found

    def on_call(i, call, args, kwargs, location):
        calls[(i, call)] = (args, kwargs, location)

    def on_done(i, call):
        # Judged as it happens: the first divergence's arguments are kept, every other call's dropped.
        args = calls.pop((i, call), None)
        if first or args is None:
            return
        if _diverges_forward(row(i, call)):
            first.append((i, call))
            captured["call"] = args

    recorder = Recorder(_members(side.model, pairs, False), pairs, False, emit, on_call, on_done)
    saved_grads = {p: p.grad for p in side.model.parameters()}
    try:
        for p in side.model.parameters():
            p.grad = None
        with torch.enable_grad():
            y = primary_output(side.call(seed))
        first_forward = _first_forward(rows, recorder.order)
        confirmation = None
        if first_forward is not None:
            recorder.remove()
            confirmation = _confirm(side, pairs, first_forward, captured.get("call") if first and
                                    first[0] == first_forward else None, store, baseline, tolerance)
        elif backward and y is not None and y.requires_grad and gradient is not None:
            seeded = seed_transform([gradient]) if seed_transform is not None else gradient
            with side.context():
                y.backward(seeded.to(device=y.device, dtype=y.dtype))
            for key, value in _parameter_grads(side.model, pairs, False, names).items():
                emit(*key, value)
    finally:
        recorder.remove()
        for p, g in saved_grads.items():
            p.grad = g
    return rows, list(recorder.order), first_forward, confirmation


def _ratio(entry):
    if not entry or entry.get("tolerance") is None:
        return None
    return entry["error"] / entry["tolerance"] if entry["tolerance"] > 0 else float("inf")


def _diverges_forward(row):
    out, inp = _ratio(row["forward"].get("out")), _ratio(row["forward"].get("in"))
    return out is not None and out > 1 and (inp is None or inp <= 1)


def _first_forward(rows, order):
    for key in order:
        if key in rows and _diverges_forward(rows[key]):
            return key
    return None


def _confirm(side, pairs, key, captured, store, baseline, tolerance):
    """The candidate's module alone on the reference's input (in the candidate's dtype), its other
    arguments as the candidate's run gave them: does the module by itself make the difference?"""
    i, call = key
    reference_input, reference_output = store.get((i, call, "in")), store.get((i, call, "out"))
    if captured is None or reference_input is None or reference_output is None:
        return {"ran": False, "why": "the module's input was not a floating-point tensor the reference also had"}
    args, kwargs, location = captured
    original = read_at(location, args, kwargs)
    fed = reference_input.to(device=original.device, dtype=original.dtype)
    args, kwargs = replace_at(location, tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args),
                              {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}, fed)
    module = mapping_.candidate_modules(side.model)[0][pairs[i].candidate]
    with torch.no_grad(), torch.random.fork_rng(devices=[]), side.context():
        y = primary_output(module(*args, **kwargs))
    alone = error(y, reference_output, tolerance.range_relative)
    limit = tolerance.of(baseline.get((i, call, "out")))
    return {"ran": True, "error": alone, "tolerance": limit, "reproduced": alone > limit}
