"""The optimizer step, named: the optimizer's state after the parameters it belongs to, the first
non-finite element of a named tensor a report stops at, and a total gradient norm that clipping
found non-finite from finite gradients (docs/python.md, "The optimizer step")."""

import weakref

import torch

from . import _amp
from ._fsdp import shard_rows
from ._optimizer_bounds import StateBounds

_NORM_OPS = ("aten::_foreach_norm", "aten::linalg_vector_norm", "aten::norm")


def name_state_after_steps(watch, optimizer):
    """Names `optimizer`'s state for `watch` now and after each of its steps, and at module
    boundaries reads what each step wrote; returns the hooks' handle."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper holds it
    # A sharded parameter's state holds this rank's rows of it (FSDP2): said after the state's name.
    names = {id(p): (n, shard_rows(p)) for n, p in _model_parameters(watch)}
    seen = [None]
    me = weakref.ref(watch)  # the optimizer's hook keeps no watchdog alive
    states = []
    bounds = StateBounds(optimizer)
    watch._state_bounds.append(bounds)

    def name_state(opt, args=None, kwargs=None):
        w = me()
        if w is None or w._native.closed:
            return
        if len(opt.state) != seen[0]:  # (Adam's state is made at the first step, then updated in place)
            seen[0] = len(opt.state)
            states[:] = [(f"{names[id(p)][0]}.{key}{names[id(p)][1] if value.dim() > 0 else ''}", value)
                         for p, state in opt.state.items() if id(p) in names
                         for key, value in state.items() if isinstance(value, torch.Tensor)]
            w._state_names = {name: weakref.ref(t) for name, t in states}
            w._native.name_tensors(states)
        if args is None or w._native.exact:
            return
        groups = range(len(opt.param_groups))
        if w._native.watching_ops:
            # This step's ops were watched, and read what they wrote: the bounds start from that.
            bounds.after_reading(w._native, opt, groups)
            return
        # Watched at module boundaries, no op of the step was seen: what it wrote is read now, but
        # for the states a bound proves finite.
        unproven = bounds.unproven_groups(w._native, opt, _amp.scaler_since(w._amp_mark))
        read = {id(t) for t in bounds.states_of(opt, unproven)}
        proven = bounds.proven_parameters
        written = [(names[id(p)][0] + names[id(p)][1], p) for index, group in enumerate(opt.param_groups)
                   if index not in proven for p in group["params"] if id(p) in names]
        w._native.check_written("optimizer.step", written + [(n, t) for n, t in states if id(t) in read])
        for index, bound in proven.items():
            w._native.proven_finite(list(opt.param_groups[index]["params"]), bound)
        bounds.after_reading(w._native, opt, unproven)

    def loop_ops_done(opt, args, kwargs):
        # Watched at module boundaries, the loop's own ops are watched from the backward's end to
        # here; what the step writes is read after it (a closure's backward, Lightning's, opens the
        # window after this and it stays open through the step).
        w = me()
        if w is not None and not w._native.closed:
            w._native.watch_loop_ops(False)
            if not w._native.exact:
                bounds.before_step(w._native, opt)

    name_state(optimizer)
    return _Handles(optimizer.register_step_pre_hook(loop_ops_done), optimizer.register_step_post_hook(name_state))


class _Handles:
    """Several hooks' handles as one."""

    def __init__(self, *handles):
        self._handles = handles

    def remove(self):
        for handle in self._handles:
            handle.remove()


def name_gradient_norm(error):
    """clip_grad_norm_ (Trainer's, Accelerate's, the user's) computes the total gradient norm
    outside the model's forward: when a norm there is what became non-finite from finite inputs
    (the gradients' squares overflow), the step is lost, and the report says so:
    `report.gradient_norm_nonfinite`, and the message."""
    report = error.report
    trigger = report.trigger if report is not None else None
    # (Outside the model's modules: the training loop's, or inside the optimizer's step, where
    # Lightning clips in the closure it hands the optimizer.)
    outside_modules = trigger is not None and (trigger.attribution == "model_root"
                                               or trigger.module_path.startswith("Optimizer.step#"))
    if (trigger is None or trigger.direction != "forward" or trigger.op.split(".")[0] not in _NORM_OPS
            or not outside_modules or not report.produced_here):
        return
    report.gradient_norm_nonfinite = True
    error.args = (f"{error.args[0]}; the total gradient norm at clipping is non-finite (from finite gradients): "
                  f"the step is lost",)


def name_first_element(error, watch):
    """A report that stops at a named tensor (a parameter, an optimizer's state) gets the first
    non-finite element of it: `report.first_nonfinite` = {tensor, index, value}, also said in the
    message. (Read after detection: the watchdog records no more ops.)"""
    report = error.report
    trigger = report.trigger if report is not None else None
    if trigger is None:
        return
    for entry in trigger.entries:
        stats = getattr(entry, "stats", None)
        if stats is None or not (stats.nan or stats.pos_inf or stats.neg_inf):
            continue
        t = _named_tensor(watch, trigger.module_path, entry.label)
        if t is None:
            continue
        # A DTensor (FSDP2's parameter) is looked at in this rank's shard, which the entry read:
        # its index is into the rows the rank holds, said after the name.
        rows = shard_rows(t) if hasattr(t, "_local_tensor") else ""
        t = getattr(t, "_local_tensor", t)
        with torch.no_grad():
            where = (~torch.isfinite(t)).nonzero()
        if len(where) == 0:
            continue  # written since
        index = tuple(int(i) for i in where[0])
        report.first_nonfinite = {"tensor": entry.label + rows, "index": index, "value": float(t[index])}
        error.args = (f"{error.args[0]}; first non-finite element: {entry.label}{rows}{list(index)} = {float(t[index])}",)
        return


def _named_tensor(watch, module_path, label):
    """The tensor an entry of a frame of `module_path` names: a named state, or a parameter."""
    ref = watch._state_names.get(label)
    if ref is not None:
        return ref()
    full = f"{module_path}.{label}" if module_path else label
    for name, p in _model_parameters(watch):
        if name == full:
            return p.detach()
    return None


def _model_parameters(watch):
    model = watch._model_ref()
    return [] if model is None else model.named_parameters(remove_duplicate=False)
