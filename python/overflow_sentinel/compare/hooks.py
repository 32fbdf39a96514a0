"""Hooks that read one side's tensors at the mapped module boundaries during one run: each module's
primary input and output, the gradient at its output, and the gradient at its input through that
module alone.

The input gradient through the module alone is read on an alias: the pre-hook hands the module a
`view_as` of its input and watches that view's gradient, which is the module's own contribution,
not the sum over every use of the tensor (a residual's other branch included)."""

import torch

from .mapping import map_tensors


def _first_tensor(value, depth=0):
    if isinstance(value, torch.Tensor):
        return value
    if depth > 3:
        return None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item, depth + 1)
            if found is not None:
                return found
    return None


def primary_output(output):
    """The tensor a module's output is compared by: the output itself, else the first tensor in
    it (a tuple's first, a ModelOutput's first field set: Llama's `logits`, an attention's output)."""
    return _first_tensor(output)


def primary_input_location(args, kwargs):
    """Where a module's compared input is: its first tensor argument, else `hidden_states`, else
    its first floating tensor keyword (Hugging Face's layers are called with keywords)."""
    for index, value in enumerate(args):
        if isinstance(value, torch.Tensor):
            return ("arg", index)
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return ("kw", "hidden_states")
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return ("kw", key)
    return None


def read_at(location, args, kwargs):
    return args[location[1]] if location[0] == "arg" else kwargs[location[1]]


def replace_at(location, args, kwargs, value):
    if location[0] == "arg":
        args = tuple(value if i == location[1] else a for i, a in enumerate(args))
    else:
        kwargs = dict(kwargs)
        kwargs[location[1]] = value
    return args, kwargs


class Recorder:
    """Hooks on the modules of one side for one run. `members` maps each module to the
    (pair index, member index) it stands for; `sizes[i]` is pair i's group size (1 on the
    candidate's side). `emit(i, call, kind, tensor)` receives each boundary's tensor in the
    candidate's form: kinds `in`, `out`, `gin`, `gout`. `on_call(i, call, args, kwargs, location)`
    sees each call's arguments (the candidate's, kept for the confirmation)."""

    def __init__(self, members, pairs, reference_side, emit, on_call=None, on_done=None):
        self.members, self.pairs, self.reference_side = members, pairs, reference_side
        self.emit, self.on_call, self.on_done = emit, on_call, on_done
        self._calls, self._open, self._pending, self._handles = {}, {}, {}, []
        self.order = []          # (pair, call) as their outputs were made: execution order
        for module, roles in members:
            self._handles.append(module.register_forward_pre_hook(self._pre(roles), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post(roles), with_kwargs=True))

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _group(self, i, call, kind, member, tensor):
        """One member's tensor; the pair's tensor in the candidate's form once the group is whole."""
        pair = self.pairs[i]
        size = len(pair.reference) if self.reference_side else 1
        if kind == "in":
            size = 1
            if member != 0:
                return
        key = (i, call, kind)
        pending = self._pending.setdefault(key, {})
        pending[member] = tensor
        if len(pending) < size:
            return
        del self._pending[key]
        parts = [pending[m] for m in range(size)]
        if self.reference_side:
            if kind in ("in", "gin"):
                joined = parts[0] if kind == "in" else sum(parts[1:], parts[0])
                value = map_tensors(pair.input, [joined]) if pair.input is not None else joined
            else:
                value = map_tensors(pair.output, parts)
        else:
            value = parts[0]
        self.emit(i, call, kind, value)

    def _pre(self, roles):
        def hook(module, args, kwargs):
            call = self._calls.get(id(module), 0)
            self._calls[id(module)] = call + 1
            self._open.setdefault(id(module), []).append(call)
            location = primary_input_location(args, kwargs)
            if location is None:
                return None
            x = read_at(location, args, kwargs)
            for i, member in roles:
                if x.is_floating_point():
                    self._group(i, call, "in", member, x.detach())
                if self.on_call is not None:
                    self.on_call(i, call, args, kwargs, location)
            if not (torch.is_grad_enabled() and x.requires_grad):
                return None
            alias = x.view_as(x)
            for i, member in roles:
                alias.register_hook(self._grad_hook(i, call, "gin", member))
            return replace_at(location, args, kwargs, alias)
        return hook

    def _grad_hook(self, i, call, kind, member):
        def hook(grad):
            self._group(i, call, kind, member, grad.detach())
        return hook

    def _post(self, roles):
        def hook(module, args, kwargs, output):
            stack = self._open.get(id(module)) or [0]
            call = stack.pop()
            y = primary_output(output)
            if y is None:
                return None
            for i, member in roles:
                if y.is_floating_point():
                    self._group(i, call, "out", member, y.detach())
                    if member == 0:
                        self.order.append((i, call))
                if y.requires_grad:
                    y.register_hook(self._grad_hook(i, call, "gout", member))
                if self.on_done is not None:
                    self.on_done(i, call)
            return None
        return hook


class ModuleStack:
    """The path of the innermost module running, for naming where a model rejected its inputs."""

    def __init__(self, modules):
        """`modules`: (path, module) pairs; none inside a compiled region, where a hook would be
        traced into the graph and change it."""
        self.stack, self.failed_in = [], None
        self._handles = []
        for path, module in modules:
            self._handles.append(module.register_forward_pre_hook(self._enter(path)))
            self._handles.append(module.register_forward_hook(self._leave()))

    def _enter(self, path):
        def hook(module, args):
            self.stack.append(path or "(root)")
            self.failed_in = self.stack[-1]
        return hook

    def _leave(self):
        def hook(module, args, output):
            if self.stack:
                self.stack.pop()
        return hook

    def innermost(self):
        return self.stack[-1] if self.stack else self.failed_in

    def remove(self):
        for handle in self._handles:
            handle.remove()
