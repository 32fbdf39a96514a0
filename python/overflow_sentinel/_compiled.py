"""Compiled models (torch.compile): watched at the compiled call's boundary, and a failing batch
replayed eagerly, op by op, to name the op that made the inf/nan.

Inductor's kernels run no ATen op, so no per-op frame exists inside a compiled region: what
crosses the compiled call is read outside the compiled code (its inputs and outputs as the
region's module, the gradients at its outputs and the parameters' .grad, and the extern kernels
that do run as ops). The watchdog's hooks inside the compiled code return at once while dynamo
traces them, so they add nothing to the graph. What a faithful replay needs is kept per call: the
arguments (by reference, with their version counters), the random-number generators' states, grad
mode, autocast and TF32; in training the gradient that arrived at the call's output."""

import sys
import weakref

import torch

from ._hooks import end_unbounded_call, enter, first_tensor_with_grad, is_compiling, leave
from ._replay import Call, keep_gradient, replay_batch


def optimized_module_type():
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None)


def is_optimized_module(module):
    kind = optimized_module_type()
    return kind is not None and isinstance(module, kind)


def unwrap(model):
    """(the module to watch, the wrapper whose call is compiled, or None)."""
    if is_optimized_module(model):
        return model._orig_mod, model
    return model, None


class Boundary:
    """The compiled calls of one region of a watched model: module `index` of the watchdog (0: the
    model), `model` its uncompiled module, `wrapper` the eager callable around the compiled code (an
    OptimizedModule), or None where module.compile() made the module's own call compiled."""

    def __init__(self, watch, model, wrapper, index=0, path=""):
        self._watch = weakref.ref(watch)
        self._model = weakref.ref(model)
        self.index = index
        self.path = path
        # Who enters and leaves the module's scope: the module's own hooks, unless they run inside
        # the compiled code (module.compile()) or the wrapper is the model itself (not watched).
        self._owns_scope = wrapper is None or index == 0
        self._calls = []  # of batch self._batch
        self._batch = None
        self._said = False
        self._patched = None
        self._graphs = _cuda_graphs(wrapper)
        self.handles = []
        if wrapper is not None:
            self.handles.append(wrapper.register_forward_pre_hook(self._pre, with_kwargs=True))
            # Before the module's own hook leaves its scope: the result is read inside it.
            self.handles.append(wrapper.register_forward_hook(self._post, with_kwargs=True, always_call=True,
                                                              prepend=True))
        else:
            self._patch_compiled_call(model)

    # ---- module.compile(): its _call_impl is compiled with our hooks inside; wrap it eagerly.

    def _patch_compiled_call(self, model):
        compiled = model._compiled_call_impl
        me = weakref.ref(self)

        def boundary_call(*args, **kwargs):
            b = me()
            if b is None or is_compiling():
                return compiled(*args, **kwargs)
            model_now = b._model()
            b._pre(model_now, args, kwargs)
            output = None
            try:
                output = compiled(*args, **kwargs)
            finally:
                b._post(model_now, args, kwargs, output)
            return output

        boundary_call.sentinel_compiled = compiled
        model._compiled_call_impl = boundary_call
        self._patched = boundary_call

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []
        model = self._model()
        if self._patched is not None and model is not None and model._compiled_call_impl is self._patched:
            model._compiled_call_impl = self._patched.sentinel_compiled
        self._patched = None
        self._calls = []

    # ---- the call's boundary, run eagerly ------------------------------------------------------

    def _pre(self, module, args, kwargs):
        w = self._watch()
        if w is None or w._native.closed or w._replaying:
            return
        end_unbounded_call(w)
        if not self._said:
            self._said = True
            what = "the model" if self.index == 0 else self.path
            sys.stdout.write(f"overflow_sentinel: {what} is compiled (torch.compile): its calls are watched at their "
                             "boundary; at an inf/nan the batch is replayed eagerly, op by op, to name the op "
                             "(replay_compiled=False turns the replay off)\n")
            if self._graphs:
                sys.stdout.write(f"overflow_sentinel: {what} runs as CUDA graphs ({self._graphs}), whose replayed kernels "
                                 "make no op event: on CUDA only its boundary and gradients are read; compile it with "
                                 "mode='max-autotune-no-cudagraphs' or 'default' to keep its extern kernels watched\n")
            sys.stdout.flush()
        if self._owns_scope:
            enter(w, self.index, args)
        batch = w._native.batch_number
        if batch != self._batch:
            self._calls, self._batch = [], batch
        # What the compiled call is handed and returns is read here: its kernels run no op that
        # would read it.
        w._native.read_call_arguments(self.index, args)
        if kwargs:
            w._native.read_call_arguments(self.index, kwargs)
        if w._replay_compiled:
            self._calls.append(Call(args, kwargs))
        w._native.set_inside_compiled_code(True)

    def _post(self, module, args, kwargs, output):
        w = self._watch()
        if w is None or w._native.closed or w._replaying:
            return
        w._native.set_inside_compiled_code(False)
        if self._calls and output is not None:
            tensor = first_tensor_with_grad(output)
            if tensor is not None:
                tensor.register_hook(keep_gradient(weakref.ref(self._calls[-1])))
        if output is not None:
            w._native.read_compiled_output(self.index, output)
        if self._owns_scope:
            leave(w, self.index, output)

    def calls_of(self, batch):
        return self._calls if batch == self._batch else []

    def first_call_serial(self):
        return self._calls[0].serial if self._calls else float("inf")

    def backward_judged(self):
        """The batch's backward was clean: the gradients kept for its replay are let go."""
        for call in self._calls:
            call.grad = None

    # ---- the replay -----------------------------------------------------------------------------

    def explain(self, error):
        """Replays the calls of the error's batch eagerly; returns the Replay, or None when there
        are none."""
        w = self._watch()
        model = self._model()
        calls = self.calls_of(error.report.batch_number)
        if w is None or model is None or not calls:
            return None
        return replay_batch(w, model, self.path, calls, error.report)


def _cuda_graphs(wrapper):
    """How `wrapper`'s compiled calls run as CUDA graphs ("mode='reduce-overhead'", "backend
    'cudagraphs'"), or None."""
    backend = getattr(getattr(wrapper, "dynamo_ctx", None), "callback", None)
    for _ in range(8):  # dynamo's wrappers keep the backend they wrap
        inner = getattr(backend, "_torchdynamo_orig_backend", None)
        if inner is None or inner is backend:
            break
        backend = inner
    if (getattr(backend, "config", None) or {}).get("triton.cudagraphs"):
        return "a mode with CUDA graphs: 'reduce-overhead' or 'max-autotune'"
    if getattr(backend, "compiler_name", None) == "cudagraphs":
        return "backend 'cudagraphs'"
    return None


# ---- while dynamo compiles; a model compiled after it was watched ------------------------------
# Dynamo's compile-start and compile-end callbacks frame the compiler's own work: the ops it runs
# on real tensors then (constants it folds, example values) are not the model's and make no frame.
# A model compiled after it was watched runs its hooks inside the compiled code, where they return
# at once: no hook of ours runs eagerly to notice it. The compile-start callback does: the watched
# model found on the stack of the call being compiled (inside an OptimizedModule, or with a
# compiled _call_impl) gets its boundary for the calls after this one.

_watching = weakref.WeakSet()


def follow_compiles(watch):
    _watching.add(watch)
    from torch._dynamo.callback import callback_handler
    # (torch._dynamo.reset() forgets the callbacks: a watchdog made after it registers again.)
    if _on_compile_start not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_on_compile_start)
    if _on_compile_end not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_on_compile_end)


def unfollow_compiles(watch):
    """`watch` is closed: once no watchdog is left, dynamo keeps no callback of ours."""
    _watching.discard(watch)
    if _live(_watching) or "torch._dynamo.callback" not in sys.modules:
        return
    from torch._dynamo.callback import callback_handler
    if _on_compile_start in callback_handler.start_callbacks:
        callback_handler.remove_start_callback(_on_compile_start)
    if _on_compile_end in callback_handler.end_callbacks:
        callback_handler.remove_end_callback(_on_compile_end)


def _live(watches):
    return [w for w in watches if not w._native.closed]


# (Dynamo runs the start callbacks when its outermost compile begins and the end callbacks when
# it ends, raised or not. Neither may raise into the user's compile.)
def _on_compile_start(*_):
    for watch in _live(_watching):
        try:
            watch._native.set_compiler_running(True)
            _notice_a_later_compile(watch)
        except Exception as error:  # noqa: BLE001
            _say_callback_failed(error)


def _notice_a_later_compile(watch):
    if any(b.index == 0 for b in watch._boundaries) or watch._replaying:
        return
    model = watch._model_ref()
    if model is None:
        return
    wrapper = _wrapper_on_stack(model)
    if wrapper is None and model._compiled_call_impl is None:
        return
    watch._boundaries.insert(0, Boundary(watch, model, wrapper))
    # The rest of this call runs compiled code with no boundary around it: its extern ops would be
    # judged as ops outside any compiled call (a mask its kernels made, read by attention, would
    # stop it). They make no frame until an eager hook or the next compiled call's boundary runs.
    watch._unbounded_compiled_call = True
    sys.stdout.write("overflow_sentinel: the watched model was compiled after it was watched: its compiled "
                     "calls are watched at their boundary from the next call on (this one is not)\n")
    sys.stdout.flush()


def _on_compile_end(*_):
    for watch in _live(_watching):
        try:
            if not watch._unbounded_compiled_call:
                watch._native.set_compiler_running(False)
        except Exception as error:  # noqa: BLE001
            _say_callback_failed(error)


def _say_callback_failed(error):
    sys.stdout.write(f"overflow_sentinel: following torch.compile's compile failed: {type(error).__name__}: {error}\n")
    sys.stdout.flush()


def _wrapper_on_stack(model):
    kind = optimized_module_type()
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if kind is not None and isinstance(candidate, kind) and candidate._orig_mod is model:
            return candidate
        frame = frame.f_back
    return None


def boundaries(watch, model, wrapper, modules):
    """The compiled regions of a newly watched model: the model itself (compiled by torch.compile,
    `wrapper`, or by model.compile()), and modules inside it that are."""
    found = []
    if wrapper is not None or model._compiled_call_impl is not None:
        found.append(Boundary(watch, model, wrapper))
    paths = None
    for index, module in enumerate(modules):
        compiled = is_optimized_module(module)
        if index == 0 or not (compiled or module._compiled_call_impl is not None):
            continue
        if paths is None:
            paths = {id(m): path for path, m in model.named_modules()}
        path = paths.get(id(module), "")
        found.append(Boundary(watch, module._orig_mod, module, index, path) if compiled
                     else Boundary(watch, module, None, index, path))
    return found


def explain(regions, error):
    """The eager replay of the error's batch, region by region (in the order of their first call),
    until one reproduces the inf/nan; the last one's Replay otherwise. None when there is nothing
    to replay, when the report is not of this rank's own inf/nan, or when it already names an op
    outside every compiled region as the one that made the value (the eager watchdog saw it)."""
    report = error.report
    if getattr(report, "kind", "nonfinite") != "nonfinite":  # another rank's inf/nan, ranks not answering
        return None
    maker = report.origin_frame or (report.trigger if report.produced_here else None)
    if maker is not None and not any(_within(maker.module_path, region.path) for region in regions):
        return None
    replay = None
    for region in sorted(regions, key=lambda r: r.first_call_serial()):
        found = region.explain(error)
        if found is not None:
            replay = found
            if found.reproduced:
                break
    return replay


def _within(path, region):
    return region == "" or path == region or path.startswith(region + ".")
