"""The module hooks through which the native watchdog follows a Python model's modules, and the
helpers they share with the compiled-call boundary (_compiled.py)."""

import collections.abc
import sys

import torch

# Inside code torch.compile traces, a hook of ours returns at once: dynamo folds the test, and the
# hook adds nothing to the graph.
is_compiling = torch.compiler.is_compiling


def first_tensor_with_grad(output, depth=0):
    """A tensor of the forward's result that the backward will reach: in tuples, lists, dicts
    (HF's ModelOutput is one) and other objects' public attributes (a dataclass), a few levels."""
    if isinstance(output, torch.Tensor):
        return output if output.grad_fn is not None else None
    if depth >= 4 or isinstance(output, (type, torch.nn.Module)) or callable(output):
        return None
    if isinstance(output, collections.abc.Mapping):
        items = output.values()
    elif isinstance(output, (list, tuple)):
        items = output
    else:
        items = [v for k, v in getattr(output, "__dict__", {}).items() if not k.startswith("_")]
    for item in items:
        found = first_tensor_with_grad(item, depth + 1)
        if found is not None:
            return found
    return None


def in_backward():
    """Whether this forward runs inside a backward: gradient checkpointing recomputing it."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1


def pre_hook(me, index):
    def pre(module, args):
        if is_compiling():
            return  # traced by torch.compile: the compiled call's boundary is watched (_compiled.py)
        w = me()
        if w is not None and not w._native.closed and not w._replaying:
            enter(w, index, args)
    return pre


def enter(w, index, args):
    if w._unbounded_compiled_call:
        end_unbounded_call(w)
    if index == 0 and not in_backward():  # a recomputed forward opens no batch
        w._begin_call()
    if w._unsharded.pending:
        w._unsharded.name_new(w)
    w._native.enter(index, args)


def register_post_hook(module, hook):
    # Run even when the forward raises: gradient checkpointing stops a recomputed forward early by
    # raising inside it, and the module must still be left (else the ops after it would be taken
    # for its own).
    try:
        return module.register_forward_hook(hook, always_call=True)
    except TypeError:  # a torch without always_call
        return module.register_forward_hook(hook)


# A buffer larger than this is not read after its module's forward (a cache of positions, a mask):
# the buffers a forward writes (batch norm's running statistics, an EMA) are small.
WRITTEN_BUFFER_ELEMENTS = 1 << 16


def buffers_it_may_write(module):
    """The names of `module`'s own small floating buffers, which its forward may write in place
    without counting a version (batch norm's running statistics while training), finite now: one
    that holds an inf/nan already (a mask made with -inf) is the model's constant, never read."""
    with torch.no_grad():
        return [name for name, b in module.named_buffers(recurse=False)
                if b.is_floating_point() and b.numel() <= WRITTEN_BUFFER_ELEMENTS and bool(torch.isfinite(b).all())]


def post_hook(me, index, buffers=()):
    def post(module, args, output):
        if is_compiling():
            return
        w = me()
        if w is not None and not w._native.closed and not w._replaying:
            written = None
            if buffers and module.training:
                written = [(name, module._buffers[name]) for name in buffers if module._buffers.get(name) is not None]
            leave(w, index, output, args, written)
    return post


def leave(w, index, output, args=None, written=None):
    if output is None and sys.exc_info()[0] is not None:
        # The forward raised (this hook runs inside torch's handler): the module is left, and
        # what was found stays pending for the next safe point (torch would only warn of an
        # error raised here, and the original exception goes on).
        w._native.leave(index, None)
        return
    deliveries = w._deliveries
    if w._callback is None:
        found = w._native.leave(index, output, args, written)
    else:  # a callback's report the module's end delivers is held, to be replayed first (_explained.py)
        deliveries.depth += 1
        try:
            found = w._native.leave(index, output, args, written)
        finally:
            deliveries.depth -= 1
    if found and not w._holding(in_forward=True):
        w._call(w._native.check)
    elif deliveries.held:
        deliveries.after_call(w, "")
    if index == 0 and not in_backward():
        w._end_call(output)


def end_unbounded_call(watch):
    """Eager code of the model, or a compiled call's boundary, runs: the call compiled after the
    model was watched is over, and ops make frames again."""
    if watch._unbounded_compiled_call:
        watch._unbounded_compiled_call = False
        if not watch._native.closed:  # (closed inside the batch: nothing is left to resume)
            watch._native.set_compiler_running(False)
