"""The eager replay of a compiled model's failing batch (_compiled.py): the calls of the batch run
again through the uncompiled module, under an op-level watchdog, from the state each call began
in; the first inf/nan it finds names the op. When the replay stays finite it says so, and why the
compiled code may have computed otherwise."""

import contextlib
import os
import sys

import torch

from ._hooks import first_tensor_with_grad
from ._report import Record

# The user's options a replay keeps: what decides where a value is an error and what a report shows.
_KEPT_OPTIONS = ("max_frames_to_save", "skip_view_ops", "strict", "allow_nonfinite", "watch_cuda")


class Replay(Record):
    """What the eager replay of a compiled batch found: batch_number, region (the compiled
    module's path, '' for the model), reproduced (whether an inf/nan came back eagerly), report
    (the replay's Report, or None), origin_line (the Python line of the op that made it, when
    known), notes (why it may differ)."""


def replay_options(options):
    kept = {k: v for k, v in options.items() if k in _KEPT_OPTIONS}
    # One process, reading back at every op (a replay runs once; it stops at the op itself).
    kept.update(action="callback", device_sync_each_op=True, ranks={"rank": 0, "world_size": 1})
    return kept


def _without_data_parallel(model):
    """The module a replay runs: a data-parallel wrapper's own module, since the wrapper's forward
    and backward would join its reducer's collectives on this rank alone (in the middle of the
    wrapper's own step: DDP's reducer fails an internal assert, or the other ranks never answer)."""
    parallel = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return (model.module, type(model).__name__) if isinstance(model, parallel) else (model, None)


def replay_batch(w, model, path, calls, report):
    model, wrapper = _without_data_parallel(model)
    batch = report.batch_number
    backward = report.trigger is not None and getattr(report.trigger, "direction", "") == "backward"
    region = f" of {path}" if path else ""
    _say(f"overflow_sentinel: replaying batch {batch}{region} eagerly through the uncompiled module, op by op "
         f"({len(calls)} compiled call{'s' if len(calls) != 1 else ''}{', with its backward' if backward else ''})")
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
                notes.append(f"{changed} was changed in place after the call: the replay starts from its new value")
            replayed = _replay_call(w, model, call, batch, options, backward, buffers)
            if replayed is not None:
                origin_line = None if backward else _origin_line(w, model, call, batch, options, replayed, buffers)
                break
        if backward and replayed is None and all(c.grad is None for c in calls):
            notes.append("no gradient reached the compiled call's output: its backward was not replayed")
        if replayed is None and not backward:
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
            made = replayed.origin_frame
            said.append(f"{made.op} in {made.module_path or 'the model'} made it at {origin_line}")
    else:
        notes[:0] = _why_not_reproduced(model) + inside
        said.append(f"the replay of batch {batch} stayed finite: the value was not reproduced eagerly")
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


def _replay_call(w, model, call, batch, options, backward, buffers):
    """The call run eagerly under an op-level watchdog (`w`'s replay_watch): the first report, or
    None."""
    found = []
    rw = w.replay_watch(model, callback=found.append, **options)
    try:
        rw.batch_number = batch
        with _restored(call), rw.batch():
            output = model(*call.args, **call.kwargs)
            if backward and call.grad is not None and not found:
                _replay_backward(model, first_tensor_with_grad(output), call.grad)
    finally:
        rw.close()
        _put_back(model, buffers)
    return found[0] if found else None


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
