"""Overflow Sentinel for PyTorch models in Python.

    from overflow_sentinel import DebugUnderflowOverflow
    debug_overflow = DebugUnderflowOverflow(model)   # as Hugging Face's, same arguments

By default the model is watched at its module boundaries (each module's forward one frame, the
gradients after the backward, what the optimizer wrote after its step), and at the first inf/nan
the batch is replayed op by op to name the op; `exact=True` watches every op (forward and backward)
in every batch. The report is printed in HF's layout and NonFiniteError (a ValueError, as HF
raises) is raised, carrying the report as an object. See docs/python.md."""

import functools
import os
import sys
import weakref

import torch

from . import _amp, _build_info, _compiled, _explained, _fsdp, _optimizer, _steps
from ._hooks import buffers_it_may_write, first_tensor_with_grad, is_compiling, post_hook, pre_hook, register_post_hook
from ._replay import BoundaryCalls


def _load_native():
    """The native part, after checking that this Python and this torch are the ones it was built
    for: another torch's libraries would fail inside the dynamic loader with an undefined symbol,
    another Python would find no module of that name. Either way the message says what to do."""
    installed = os.path.basename(os.path.dirname(os.path.dirname(__file__))) in ("site-packages", "dist-packages")
    if installed:  # by pip (docs/install.md)
        rebuild = (f"install it again into this environment, beside its torch "
                   f"({sys.executable} -m pip install --no-build-isolation <a clone of overflow-sentinel>)")
    else:  # a build tree's
        rebuild = (f"rebuild the module for this interpreter (cmake -DSENTINEL_PYTHON={sys.executable}, "
                   f"with the LibTorch of its torch), or run it with {_build_info.python}")
    here = ".".join(str(v) for v in sys.version_info[:3])
    if here.rsplit(".", 1)[0] != _build_info.python_version.rsplit(".", 1)[0]:
        raise ImportError(f"overflow_sentinel was built for Python {_build_info.python_version} "
                          f"({_build_info.ext_suffix}); this is Python {here}: {rebuild}")
    if torch.__version__ != _build_info.torch_version:
        raise ImportError(f"overflow_sentinel was built against torch {_build_info.torch_version}; "
                          f"this Python imports torch {torch.__version__} from "
                          f"{torch.__file__.rsplit('/', 2)[0]}: {rebuild}")
    from . import _native as native
    return native


_native = _load_native()
from ._errors import AbortAfterBatch, Fp8AlarmError, NonFiniteError, RanksMissingError, SentinelError
from ._report import Entry, Frame, Record, Report
from .compare import compare

__version__ = _native.__version__
__all__ = ["DebugUnderflowOverflow", "Watch", "watch", "watch_steps", "Report", "Frame", "Entry", "SentinelError",
           "NonFiniteError", "Fp8AlarmError", "RanksMissingError", "AbortAfterBatch", "option_names", "compare"]


def option_names():
    """The keyword arguments Watch and DebugUnderflowOverflow take besides their own."""
    return sorted(_native.option_names())


def _refuse_unknown_options(options, who):
    """A front end's keyword arguments are the watchdog's options: any other is a TypeError that
    names it."""
    unknown = sorted(set(options) - set(option_names()) - {"config", "callback"})
    if unknown:
        raise TypeError(f"overflow_sentinel: {who} got options that do not exist: {', '.join(unknown)} "
                        f"(overflow_sentinel.option_names() lists them)")


def _compiled_modules(model):
    """Modules whose ops may run fused, where no callback sees them one by one."""
    found = []
    for path, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):
            found.append((path, "it runs as TorchScript, whose fusers run groups of ops as one kernel",
                          "torch._C._jit_set_texpr_fuser_enabled(False) (and nvfuser's switch), or watch its eager module"))
    return found


class Watch:
    """Watches `model` from construction until close() (or the end of a `with` block), or until
    the model is collected.

    A batch is one call of the model (its top module's forward) unless `batch()` opens one for a
    training step. Keyword arguments are the native Options (option_names()); `config` is a YAML
    config in TransformerEngine's layout, applied first; `callback(report)` with action='callback'
    (implied) is called at detection instead of raising.

    A compiled model (torch.compile(model), model.compile()) is watched at its compiled call's
    boundary; at an inf/nan the batch is replayed eagerly to name the op, unless `replay_compiled`
    is False (docs/compile.md)."""

    # Whether the model's hooks keep the watchdog alive (DebugUnderflowOverflow: as HF's object,
    # which lives through the hooks it registered), and whether a newer one replaces it.
    _lives_with_model = False
    # A replay's watchdog (_replay.py) watches a model already watched, for one batch.
    _is_replay = False
    # The call during which a compile after watching was noticed runs unbounded (_compiled.py).
    _unbounded_compiled_call = False
    # What a batch() is, in its report (a training step: no phase said).
    _step_phase = None
    # The watchdog of each model being watched, to refuse a second (weakly: it keeps no model alive).
    _of_model = weakref.WeakKeyDictionary()

    def __init__(self, model, *, config=None, callback=None, replay_compiled=True, **options):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"overflow_sentinel: model must be a torch.nn.Module, not {type(model).__name__}")
        model, compiled_wrapper = _compiled.unwrap(model)
        older = None if self._is_replay else Watch._of_model.get(model)
        older = older() if older is not None else None
        if older is not None and older._native.closed:
            older = None
        if older is not None and not (self._lives_with_model and older._lives_with_model):
            raise ValueError("overflow_sentinel: this model is already watched; close() that watchdog first")
        if config is not None and not isinstance(config, str) and not hasattr(config, "__fspath__"):
            raise TypeError(f"overflow_sentinel: config must be a path, not {type(config).__name__}")
        if callback is not None and not callable(callback):
            raise TypeError(f"overflow_sentinel: callback must be callable, not {type(callback).__name__}")
        # What the native side holds refers to this object weakly: Python's cycle collector does not
        # see into it, so a strong reference there (to a callback that names the model, say) would
        # keep the model, and through its hooks this watchdog, alive for good.
        me = weakref.ref(self)
        self._callback = callback
        native_callback = None if callback is None else functools.partial(_call_back, me)
        self._native = _native.Watch(model, options, None if config is None else str(config), native_callback)
        self._options = options
        self._replay_compiled = bool(replay_compiled)
        self._replaying = False
        self._deliveries = _explained.Deliveries()
        self._flush()  # what starting said (allow_nonfinite patterns that match no module)
        # fp16 AMP: a backward GradScaler scaled, and whose step it then skips (_amp.py).
        self._amp_entered = not self._is_replay
        if self._amp_entered:
            _amp.enter()
        self._amp_mark = _amp.generation()
        self._amp_held = None
        self._skipped_steps = []
        if older is not None and not self._is_replay:
            older.close()  # Trainer builds a new one at every train(): the newer one watches
        self._explicit = 0
        # Trainer (trainer.py): forwards between its steps are an evaluation's, and say so.
        self._between_steps_is_evaluation = False
        self._hold_to_step_end = False
        self._phase = None
        self._compiled = _compiled_modules(model)
        self._handles = []
        # The hooks hold this object strongly when it lives as long as the model, else weakly.
        hold = (lambda target=self: target) if self._lives_with_model else me
        # FSDP2: the unsharded parameters its forwards read, named as FSDP makes them (_fsdp.py).
        self._unsharded = _fsdp.UnshardedParameters(model)
        if self._unsharded.shards:
            self._native.name_tensors(self._unsharded.shards)
        modules = self._native.take_modules()
        # At module boundaries the buffers a training forward may write are read after it.
        at_boundaries = not self._is_replay and not self._native.exact
        written = [buffers_it_may_write(m) if at_boundaries else [] for m in modules]
        for index, module in enumerate(modules):
            try:
                self._handles.append(module.register_forward_pre_hook(pre_hook(hold, index)))
                self._handles.append(register_post_hook(module, post_hook(hold, index, written[index])))
            except RuntimeError:
                pass  # a scripted module's children: run by TorchScript, seen through their ops
        self._boundaries = [] if self._is_replay else _compiled.boundaries(self, model, compiled_wrapper, modules)
        # Watched at its module boundaries, an eager model's calls are kept for a replay.
        self._boundary_calls = BoundaryCalls(self, model, modules, written) if at_boundaries else None
        if self._is_replay:
            self._model_ref = weakref.ref(model)
            return
        _compiled.follow_compiles(self)
        Watch._of_model[model] = me
        self._model_ref = weakref.ref(model)
        self._state_names = {}
        self._state_bounds = []  # _optimizer_bounds.StateBounds of each optimizer watched
        # Once the model is gone there is nothing left to watch: the watchdog closes then.
        self._finalizer = weakref.finalize(model, _close_if_alive, me)

    # ---- the hooks' work ------------------------------------------------------------------------

    def _flush(self):
        text = self._native.take_text()
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
        return text

    def _call(self, native_method):
        """Calls the native side, printing what it printed even when it raises what it found; what
        it delivered without raising is replayed once it has returned (_explained.py)."""
        self._deliveries.depth += 1
        try:
            result = native_method()
        except NonFiniteError as error:
            _optimizer.name_gradient_norm(error)
            _optimizer.name_first_element(error, self)
            _fsdp.mixed_precision(error, self)
            if not self._scaled_backward(error):  # (else its GradScaler decides first)
                self._explain(error)
            raise
        finally:
            self._deliveries.depth -= 1
            printed = self._flush()
        self._deliveries.after_call(self, printed)
        return result

    def _explain(self, error):
        _explained.explain(self, error)

    def _scaled_backward(self, error):
        """Whether `error` is of a backward a GradScaler scaled, whose step() judges it (_amp.py)."""
        trigger = error.report.trigger if error.report is not None else None
        return (_amp.scaler_since(self._amp_mark) is not None and trigger is not None
                and trigger.direction == "backward")

    def _begin_call(self):
        if self._compiled:
            for path, why, how in self._compiled:
                sys.stdout.write(f"overflow_sentinel: {path or 'the model'} is not watched op by op: {why}. "
                                 f"To watch it: {how}.\n")
            self._compiled = []
        if self._amp_held is not None:
            error, self._amp_held = self._amp_held, None  # no GradScaler.step() came to judge it
            _amp.forget(self)
            self._explain(error)
            raise error
        self._amp_mark = _amp.generation()
        if not self._explicit:
            self._set_phase("evaluation" if self._between_steps_is_evaluation else None)
            self._call(self._native.begin_batch)
        else:
            self._native.watch_loop_ops(False)  # (the next micro-batch's forward: module frames again)

    def _set_phase(self, phase):
        """What the batches opened from now on are, in their reports (Report.phase)."""
        if phase != self._phase:
            self._native.set_phase(phase or "")
        self._phase = phase

    def _end_call(self, output):
        if not self._explicit:
            self._call(self._native.end_batch)
        self._watch_backward(output)

    def _watch_backward(self, output):
        tensor = first_tensor_with_grad(output)
        if tensor is None:
            return
        me = weakref.ref(self)

        def on_gradient(grad):
            if is_compiling():
                return
            w = me()
            if w is not None and not w._native.closed:
                torch.autograd.Variable._execution_engine.queue_callback(w._after_backward)

        tensor.register_hook(on_gradient)

    def _after_backward(self):
        if self._native.closed:
            return
        # (A backward that a GradScaler scaled is judged now: its scaler decides at step() whether
        # what it found is an overflow it skips, _amp.py.)
        if self._holding() and _amp.scaler_since(self._amp_mark) is None:
            self._call(self._native.check_gradients)  # raised at the step's end (_meet_after_backward)
        else:
            self._judge_backward(self._native.after_backward)
        # At module boundaries the loop's ops on the gradients until the step (clipping) are watched.
        if not self._native.closed:
            self._native.watch_loop_ops(True)

    def _meet_after_backward(self, loop_ops_done=True):
        """The step's backward is done (Trainer: before the optimizer step): the ranks meet, and what
        was found is raised. `loop_ops_done`: the loop's own ops are over (Lightning's are not)."""
        if not self._native.closed:
            if loop_ops_done:
                self._native.watch_loop_ops(False)
            self._judge_backward(self._native.meet_after_backward)

    def _holding(self, in_forward=False):
        # Trainer, Accelerate (trainer.py, accelerate.py): inside a step, nothing is raised before
        # the step's end, where every rank stops alike: none raises in a forward or backward whose
        # all-reduce another waits in. (A forward without gradients, an evaluation's, has no
        # backward to come: it raises at once.)
        if not (self._hold_to_step_end and self._explicit > 0):
            return False
        return not in_forward or torch.is_grad_enabled()

    def _judge_backward(self, native_method):
        scaler = _amp.scaler_since(self._amp_mark)
        try:
            self._call(native_method)
        except NonFiniteError as error:
            if not self._scaled_backward(error):
                raise
            # A scaled backward: its scaler's step() says whether this is an overflow it skips.
            self._amp_held = error
            _amp.hold(scaler, self, error)
        else:
            for boundary in self._boundaries:
                boundary.backward_judged()
            if self._boundary_calls is not None:
                self._boundary_calls.backward_judged()

    def _amp_skipped(self, error, scale):
        self._amp_held = None
        record = {"batch_number": error.report.batch_number, "scale": scale, "origin": error.report.origin}
        self._skipped_steps.append(record)
        sys.stdout.write(f"overflow_sentinel: GradScaler skips the step of batch {record['batch_number']}: its "
                         f"gradients at scale {scale:g} hold inf/nan (it lowers its scale); counted, not an error\n")
        sys.stdout.flush()

    def _amp_resolved(self, error):
        self._amp_held = None
        self._explain(error)

    # ---- the user's calls ---------------------------------------------------------------------

    def batch(self):
        """`with w.batch():` one training step (forward, loss.backward(), optimizer step) as one
        batch; what was detected is raised at its end, or earlier at a module's end."""
        return _Batch(self)

    def check(self):
        """Raises what was detected since the last check, if anything."""
        self._call(self._native.check)

    @property
    def batch_number(self):
        """The number the next batch will get (= batches finished so far, unless set)."""
        return self._native.batch_number

    @batch_number.setter
    def batch_number(self, next_number):
        """Between batches: the number the next batch gets (a run resumed from a checkpoint goes
        on from its step). A ValueError for a negative number, a RuntimeError inside a batch."""
        self._native.set_batch_number(int(next_number))

    @property
    def report(self):
        """The most recent Report, or None."""
        text = self._native.last_report_json()
        return None if text is None else Report.from_json(text)

    def fp8_metrics(self):
        """The FP8 metrics of the last closed step, one Record per slot (fp8=... enabled)."""
        import json
        return [Record(json.loads(line)) for line in self._native.fp8_metrics_json()]

    def saved_frames(self):
        """The frames kept now, oldest first (at most max_frames_to_save)."""
        return Report.from_json(self._native.saved_frames_json()).frames

    @property
    def amp_skipped_steps(self):
        """fp16 AMP: the steps GradScaler skipped for inf/nan gradients this watchdog found, one
        dict each: batch_number, scale (the scaler's, before it lowered it), origin."""
        return list(self._skipped_steps)

    def tolerated(self):
        """The non-finite values the place rule tolerated so far (a -inf mask consumed inside the
        module that made it), one dict per module and op: module_path, module_class, op, allowed
        (by an allow_nonfinite pattern), frames, nan, pos_inf, neg_inf, first_batch, last_batch.
        Empty under strict=True."""
        import json
        return json.loads(self._native.tolerated_json())["tolerated"]

    def watch_optimizer(self, optimizer):
        """Names `optimizer`'s state after the parameters it belongs to ('h.0.fc.weight.exp_avg_sq')
        after each of its steps: the ops that read or write it show that name, and a report that
        stops there names the first non-finite element. At module boundaries, what each step wrote
        is read after it (unless proven finite) and the loop's own ops are watched until it begins.
        Returns the hooks' handle."""
        handle = _optimizer.name_state_after_steps(self, optimizer)
        self._handles.append(handle)
        return handle

    def replay_watch(self, model, **options):
        """The op-level watchdog an eager replay of a batch runs under (_replay.py)."""
        return _ReplayWatch(model, **options)

    def headroom(self):
        """Lines on what fp16/bf16 would overflow or flush (headroom=True)."""
        return self._native.describe_headroom()

    def close(self):
        """Removes the hooks and the watchdog (its last FP8 step and device reads delivered).
        The model and torch are left as they were."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for boundary in getattr(self, "_boundaries", []):
            boundary.remove()
        self._boundaries = []
        if getattr(self, "_boundary_calls", None) is not None:
            self._boundary_calls.remove()
            self._boundary_calls = None
        if not self._is_replay:
            _compiled.unfollow_compiles(self)
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer.detach()
        if getattr(self, "_amp_entered", False):
            self._amp_entered = False
            _amp.forget(self)
            _amp.leave()
        if not self._native.closed:
            text = self._native.close()
            if text:
                sys.stdout.write(text)
                sys.stdout.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


class _Batch:
    def __init__(self, watch):
        self._watch = watch

    def __enter__(self):
        w = self._watch
        w._set_phase(w._step_phase)
        w._call(w._native.begin_batch)
        w._explicit += 1
        return w

    def __exit__(self, exc_type, exc, tb):
        w = self._watch
        w._explicit -= 1
        _compiled.end_unbounded_call(w)  # a call compiled inside the batch is over by its end
        if w._native.closed:
            return False  # closed inside the block: closing ended the batch
        try:
            w._call(w._native.end_batch)
        except SentinelError:
            if exc_type is None:
                raise  # what the step found; an exception already leaving the block goes on instead
        return False


def _call_back(me, report_json, text):
    w = me()
    if w is not None and w._callback is not None:
        report = Report.from_json(report_json, text)
        if not w._deliveries.hold(w, report, w._callback):  # (else called once it is replayed)
            w._callback(report)


def _close_if_alive(me):
    w = me()
    if w is not None:
        w.close()


class _ReplayWatch(Watch):
    _is_replay = True
    _step_phase = "eager replay"


class DebugUnderflowOverflow(Watch):
    """Hugging Face's DebugUnderflowOverflow, drop-in: the same arguments, the same report
    layout, a ValueError at the first inf/nan; and every other option by keyword.

    As HF's, it lives as long as the model, whether or not the caller keeps it (the model's hooks
    hold it; it holds nothing that holds the model), and a new one on the same model (Trainer makes
    one at every train()) closes and replaces the older."""

    _lives_with_model = True

    def __init__(self, model, max_frames_to_save=21, trace_batch_nums=[], abort_after_batch_num=None, **options):  # noqa: B006 - HF's signature
        super().__init__(model, max_frames_to_save=max_frames_to_save, trace_batch_nums=trace_batch_nums,
                         abort_after_batch_num=abort_after_batch_num, **options)


def watch(model, **options):
    """`with overflow_sentinel.watch(model, **options) as w:` ... the watchdog goes at the end."""
    return Watch(model, **options)


def watch_steps(model, optimizer, **options):
    """Watches a training loop's `model` step by step: an optimizer step (its micro-batches'
    forwards and backwards, then `optimizer.step()`) is one batch; what it found is raised from
    `optimizer.step()` before the optimizer writes, where every rank (DDP, FSDP2) is past the
    gradients' collective, and what the optimizer made, after it. Returns the watchdog."""
    return _steps.watch_steps(DebugUnderflowOverflow(model, **options), model, optimizer)
