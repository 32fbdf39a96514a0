"""The eager replay of a failing batch: of a compiled model's (_compiled.py), or of an eager model
watched at its module boundaries (Options.exact false: BoundaryCalls below). The calls of the
batch run again through the uncompiled module, under an op-level watchdog, from the state each
call began in; the first inf/nan it finds names the op. When the replay stays finite it says so,
and why the run may have computed otherwise."""

import contextlib
import copy
import itertools
import os
import sys
import weakref

import torch

from ._fsdp import sharded_module_paths
from ._hooks import first_tensor_with_grad, is_compiling
from ._report import Record

# The user's options a replay keeps: what decides where a value is an error and what a report shows.
_KEPT_OPTIONS = ("max_frames_to_save", "skip_view_ops", "strict", "allow_nonfinite", "watch_cuda")


_serial = itertools.count()

# The frames of a call's site kept (torch's and this package's among them, left out when shown).
_SITE_FRAMES = 64


class Call:
    """What one call (of a compiled region, or of an eager model watched at its boundaries) needs
    to be replayed eagerly, op by op."""

    def __init__(self, args, kwargs, buffers=()):
        self.serial = next(_serial)
        # The buffers the forward may write in place (batch norm's running statistics while
        # training), as the call found them: the replay starts from these, not from what the run
        # wrote into them since.
        with torch.no_grad():
            self.buffers = [(b, b.detach().clone()) for b in buffers]
        self.args = args
        self.kwargs = kwargs
        # (Inference tensors keep no version counter: nothing can write them outside inference mode.)
        self.versions = [(path, t, t._version) for path, t in _tensors_in(("args", args), ("kwargs", kwargs))
                         if not t.is_inference()]
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.grad_enabled = torch.is_grad_enabled()
        self.autocast = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")}
        self.tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        self.grad = None  # that the call's output got in the backward
        # Where the call was made from, innermost first: a replay run where the error is raised
        # (before an optimizer's step) shows these lines outside the model, not the raise's.
        self.site = []
        frame = sys._getframe(1)
        while frame is not None and len(self.site) < _SITE_FRAMES:
            self.site.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back

    def changed_inputs(self):
        """What changed in the call's arguments since it began: each as a phrase ("args[0] was
        changed in place"). A cache object handed in (HF's DynamicCache) is looked into: the
        forward itself replaces its layers' tensors, which the replay then starts from."""
        now = dict(_tensors_in(("args", self.args), ("kwargs", self.kwargs)))
        kept = {path for path, _, _ in self.versions}
        changed = []
        for path, t, version in self.versions:
            if now.get(path) is not t:
                changed.append(f"{path} was replaced")
            elif t._version != version:
                changed.append(f"{path} was changed in place")
        grown = [path for path in now if path not in kept]
        if grown:
            changed.append(f"{grown[0]}{f' and {len(grown) - 1} more' if len(grown) > 1 else ''} appeared")
        return changed


def _tensors_in(*named, depth=0):
    for path, value in named:
        if isinstance(value, torch.Tensor):
            yield path, value
        elif depth >= 6 or value is None or isinstance(value, (str, bytes, int, float, bool, type, torch.nn.Module)):
            continue
        elif isinstance(value, (list, tuple)):
            yield from _tensors_in(*((f"{path}[{i}]", v) for i, v in enumerate(value)), depth=depth + 1)
        elif isinstance(value, dict):
            yield from _tensors_in(*((f"{path}[{k!r}]", v) for k, v in value.items()), depth=depth + 1)
        elif not callable(value) and hasattr(value, "__dict__"):  # a cache object and its layers
            yield from _tensors_in(*((f"{path}.{k}", v) for k, v in vars(value).items() if not k.startswith("_")),
                                   depth=depth + 1)


def keep_gradient(call_ref):
    """A tensor hook keeping the gradient that reaches a call's output, for its backward's replay."""
    def keep(grad):
        call = call_ref()
        if call is not None and not is_compiling():
            call.grad = grad
    return keep


class BoundaryCalls:
    """The top-level calls of an eager model watched at its module boundaries (Options.exact
    false), kept for the batch they ran in: what the replay of a failing batch needs. Its hooks
    also read the model's own arguments, keyword ones included (the watchdog's pre-hook sees only
    the positional ones)."""

    def __init__(self, watch, model, modules, written):
        self._watch = weakref.ref(watch)
        self._model = weakref.ref(model)
        self._calls = []
        self._batch = None
        # The buffers a training forward may write in place (`written`: their names in each of
        # `modules`, _hooks.buffers_it_may_write), kept as each call found them.
        self._buffers = [m._buffers[name] for m, names in zip(modules, written) for name in names]
        # After the watchdog's own pre-hook, which opens the batch; before its forward hook, which
        # may end it.
        self.handles = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                        model.register_forward_hook(self._post, prepend=True)]

    def _live(self):
        w = self._watch()
        return w if w is not None and not w._native.closed and not w._replaying and not is_compiling() else None

    def _pre(self, module, args, kwargs):
        w = self._live()
        if w is None or w._native.watching_ops or w._boundaries:
            return  # (op by op, or a compiled model: its boundary keeps its calls)
        batch = w._native.batch_number
        if batch != self._batch:
            self._calls, self._batch = [], batch
        w._native.read_call_arguments(0, args)
        if kwargs:
            w._native.read_call_arguments(0, kwargs)
        self._calls.append(Call(args, kwargs, self._buffers if module.training else ()))

    def _post(self, module, args, output):
        w = self._live()
        if w is None or not self._calls or output is None:
            return
        tensor = first_tensor_with_grad(output)
        if tensor is not None:
            tensor.register_hook(keep_gradient(weakref.ref(self._calls[-1])))

    def backward_judged(self):
        for call in self._calls:
            call.grad = None

    def explain(self, error):
        """The replay of the error's batch, op by op, when its report is of a module's whole
        forward or of a gradient (what the boundaries saw, not the op that made it); else None."""
        w, model, report = self._watch(), self._model(), error.report
        trigger = report.trigger if report is not None else None
        if (w is None or model is None or trigger is None or getattr(report, "kind", "nonfinite") != "nonfinite"
                or not (trigger.op == "forward" or trigger.direction == "backward")):
            return None
        calls = self._calls if report.batch_number == self._batch else []
        if not calls:
            return None
        return replay_batch(w, model, "", calls, report, compiled=False)

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self._calls = []


class Replay(Record):
    """What the eager replay of a compiled batch found: batch_number, region (the compiled
    module's path, '' for the model), reproduced (whether an inf/nan came back eagerly), report
    (the replay's Report, or None), origin_line (the Python line of the op that made it, when
    known), notes (why it may differ)."""


def replay_options(options):
    kept = {k: v for k, v in options.items() if k in _KEPT_OPTIONS}
    # One process, reading back at every op (a replay runs once; it stops at the op itself).
    kept.update(action="callback", device_sync_each_op=True, ranks={"rank": 0, "world_size": 1}, exact=True)
    return kept


def _without_data_parallel(model):
    """The module a replay runs: a data-parallel wrapper's own module, since the wrapper's forward
    and backward would join its reducer's collectives on this rank alone (in the middle of the
    wrapper's own step: DDP's reducer fails an internal assert, or the other ranks never answer)."""
    parallel = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return (model.module, type(model).__name__) if isinstance(model, parallel) else (model, None)


def replay_batch(w, model, path, calls, report, compiled=True):
    """Replays `calls` of the report's batch op by op; `compiled`: they ran compiled (else at the
    boundaries of an eager model). Returns the Replay."""
    model, wrapper = _without_data_parallel(model)
    batch = report.batch_number
    why_not = _why_not_replayable(model)
    if why_not:
        said = [f"batch {batch} was not replayed: {why_not}; the report above stands"]
        _say(f"overflow_sentinel: {said[0]}")
        result = Replay({"batch_number": batch, "region": path, "reproduced": False, "origin_line": None,
                         "notes": said})
        result.report = None
        _write(w, batch, path, None, said)
        return result
    backward = report.trigger is not None and getattr(report.trigger, "direction", "") == "backward"
    region = f" of {path}" if path else ""
    how = "eagerly through the uncompiled module" if compiled else "under op-level watching"
    kind = "compiled call" if compiled else "call"
    _say(f"overflow_sentinel: replaying batch {batch}{region} {how}, op by op "
         f"({len(calls)} {kind}{'s' if len(calls) != 1 else ''}{', with its backward' if backward else ''})")
    replayed = None
    origin_line = None
    notes = []
    inside = []  # where inside the compiled graph, when the replay stays finite
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    options = replay_options(w._options)
    w._replaying = True
    try:
        for call in calls:
            for changed in call.changed_inputs():
                notes.append(f"{changed} after the call: the replay starts from what it holds now")
            if backward and call.grad is not None and not bool(torch.isfinite(call.grad).all()):
                notes.append("the gradient that reached the model's output was already non-finite: what made it "
                             "ran outside the model (the loss)")
            replayed = _replay_call(w, model, call, batch, options, backward, buffers)
            if replayed is not None:
                origin_line = None if backward else _origin_line(w, model, call, batch, options, replayed, buffers)
                break
        if backward and replayed is None and all(c.grad is None for c in calls):
            notes.append("no gradient reached the compiled call's output: its backward was not replayed")
        if replayed is None and not backward and compiled:
            from ._graph_probe import first_nonfinite_in_graph
            inside = first_nonfinite_in_graph(model, calls[-1], _restored)
    except Exception as error:  # noqa: BLE001 - the replay explains; it never hides the detection
        notes.append(f"the replay stopped: {type(error).__name__}: {error}")
        inside = []
    finally:
        _put_back(model, buffers)
        w._replaying = False
    said = []  # after the replay's report, if any
    if replayed is not None:
        sys.stdout.write(replayed.text or "")
        if origin_line:
            made = replayed.origin_frame or replayed.trigger  # (strict: the op that made it stopped)
            said.append(f"{made.op} in {made.module_path or 'the model'} made it at {origin_line}")
    else:
        notes[:0] = (_why_not_reproduced(model) if compiled else _why_eager_not_reproduced()) + inside
        said.append(f"the replay of batch {batch} stayed finite: the value was not reproduced "
                    f"{'eagerly' if compiled else 'op by op'}")
    if path:
        notes.append(f"the replay watched {path} alone: its module paths are inside {path}")
    if wrapper:
        notes.append(f"the replay ran the module inside {wrapper} without it (no collectives): its module paths "
                     f"lack the leading 'module.'")
    said += notes
    for line in said:
        _say(f"overflow_sentinel: {line}")
    result = Replay({"batch_number": batch, "region": path, "reproduced": replayed is not None,
                     "origin_line": origin_line, "notes": notes})
    result.report = replayed
    _write(w, batch, path, replayed, said)
    return result


def _why_not_replayable(model):
    """Why running `model` again on this rank alone would hang or fail, or None."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not distributed or torch.distributed.get_world_size() == 1:
        return None
    sharded = sharded_module_paths(model)
    if sharded:
        return (f"{sharded[0] or 'the model'} is sharded by FSDP2, whose forward gathers its parameters with "
                "collectives every rank must join, and the other ranks are not replaying")
    return None


def _replay_call(w, model, call, batch, options, backward, buffers):
    """The call run eagerly under an op-level watchdog (`w`'s replay_watch): the first report, or
    None."""
    from ._native import set_replayed_call_site  # (loaded by the package once its torch is checked)
    found = []
    # The run's gradients are set aside: the replay's backward accumulates none (autograd.grad),
    # and its watchdog, reading .grad at the batch's end, would find the run's, not its own.
    held = [(p, p.grad) for p in model.parameters() if p.grad is not None]
    for p, _ in held:
        p.grad = None
    rw = w.replay_watch(model, callback=found.append, **options)
    try:
        rw.batch_number = batch
        args, kwargs = _own_containers(call)
        with _restored(call), rw.batch():
            # The forward's stacks go on with the call's site; the backward's are autograd's, as in the run.
            set_replayed_call_site(_replay_call.__code__, call.site)
            try:
                output = model(*args, **kwargs)
            finally:
                set_replayed_call_site(None, [])
            if backward and call.grad is not None and not found:
                _replay_backward(model, first_tensor_with_grad(output), call.grad)
    finally:
        rw.close()
        _put_back(model, buffers)
        for p, grad in held:
            p.grad = grad
    return found[0] if found else None


def _own_containers(call):
    """The call's arguments in containers of the replay's own, holding the same tensors: a cache
    object the forward extends (HF's DynamicCache appends each layer's keys) is extended in the
    replay's copy, not in the one the run keeps. As they are when they cannot be copied."""
    shared = {id(t): t for _, t in _tensors_in(("args", call.args), ("kwargs", call.kwargs))}
    try:
        return copy.deepcopy((call.args, call.kwargs), shared)
    except Exception:  # noqa: BLE001 - an object that refuses copying is handed as it is
        return call.args, call.kwargs


def _origin_line(w, model, call, batch, options, replayed, buffers):
    """The Python line of the op that made the value: the report's stack is taken where the value
    was stopped (where it left its module). Replayed once more with every op's inf/nan an error,
    the first op stopped is that op itself, unless an op before it makes a value its model means
    (a -inf mask): then no line is claimed."""
    made = replayed.origin_frame
    if made is None:
        return replayed.python_stack[0] if replayed.produced_here and replayed.python_stack else None
    strict = _replay_call(w, model, call, batch, dict(options, strict=True), False, buffers)
    if strict is None or not strict.python_stack:
        return None
    first = strict.trigger
    if first.op != made.op or first.module_path != made.module_path:
        return None
    return strict.python_stack[0]


def _put_back(model, buffers):
    """The buffers a replay changed (a batch norm's running statistics) as they were."""
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in buffers and b.shape == buffers[name].shape:
                b.copy_(buffers[name])


def _replay_backward(model, output, grad):
    if output is None or output.shape != grad.shape:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    if params:
        torch.autograd.grad(output, params, grad_outputs=grad, allow_unused=True)


@contextlib.contextmanager
def _restored(call):
    """The random-number generators, grad mode, autocast and TF32 as the call found them; all as
    they were afterwards."""
    devices = list(range(len(call.cuda_rng))) if call.cuda_rng is not None else []
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=devices))
        torch.set_rng_state(call.cpu_rng)
        if call.cuda_rng is not None:
            torch.cuda.set_rng_state_all(call.cuda_rng)
        stack.enter_context(torch.set_grad_enabled(call.grad_enabled))
        for device, (enabled, dtype) in call.autocast.items():
            if enabled:
                stack.enter_context(torch.autocast(device, dtype=dtype))
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = call.tf32
        with torch.no_grad():
            for buffer, found in call.buffers:
                buffer.copy_(found)  # (the run's are put back after the replay: _put_back)
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def _why_not_reproduced(model):
    why = ["compiled code computes otherwise than eager: fused ops keep intermediates in float32 and round "
           "once, and sums may be reassociated"]
    inductor_config = sys.modules.get("torch._inductor.config")
    random_ops = [name for name, m in model.named_modules()
                  if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 and m.training]
    if random_ops and inductor_config is not None and not inductor_config.fallback_random:
        why.append(f"the compiled code draws its own random numbers ({random_ops[0] or 'the model'} is a dropout): "
                   "the replay's differ; torch._inductor.config.fallback_random = True makes them the same")
    return why


def _why_eager_not_reproduced():
    return ["the batch ran otherwise the second time: a nondeterministic op, a path that depends on data or on "
            "state the run changed since (a cache, a counter), or an input changed in place; the boundary's "
            "report stands"]


def _write(w, batch, path, replayed, said):
    directory = w._options.get("report_dir")
    if not directory:
        return
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed and torch.distributed.get_world_size() > 1:
        directory = os.path.join(str(directory), f"rank{torch.distributed.get_rank()}")  # beside the rank's report
    stem = os.path.join(str(directory), f"sentinel_batch{batch}_replay" + (f"_{path}" if path else ""))
    try:
        with open(stem + ".txt", "w") as f:
            f.write(replayed.text if replayed is not None else "")
            for line in said:
                f.write(f"{line}\n")
    except OSError as error:
        _say(f"overflow_sentinel: the replay's report could not be written to {stem}.txt: {error}")


def _say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
