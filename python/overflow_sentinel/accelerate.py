"""An Accelerate training loop on the sentinel, in one line (docs/python.md):

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    watch = overflow_sentinel.accelerate.watch_steps(accelerator, model, optimizer)

An optimizer step is one batch: it opens at the first forward after the last step and ends when
the optimizer has stepped, so the gradient-accumulation micro-batches of `accelerator.accumulate`
(whose optimizer.step() does nothing until the gradients sync) are one batch, numbered by the
steps taken. Nothing is raised inside a training step: what its forwards and backwards found is
raised from `optimizer.step()` before the optimizer writes, and what the optimizer made after it,
before `zero_grad`; under DDP every rank gets there past the gradient all-reduce and the ranks stop
at the same step. (A forward without gradients, an evaluation's, raises at once.) The model is
watched unwrapped (DDP's wrapper runs the same modules). Keyword arguments are the watchdog's
options.
"""

import sys

from . import DebugUnderflowOverflow
from ._hooks import in_backward

__all__ = ["watch_steps"]


def watch_steps(accelerator, model, optimizer, **options):
    """Watches `model` (as prepared, or not) step by step; returns the watchdog. `close()` on it
    ends the watching and removes the step hooks."""
    inner = accelerator.unwrap_model(model)
    torch_optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper holds it
    if not hasattr(torch_optimizer, "register_step_post_hook"):
        raise TypeError(f"overflow_sentinel: watch_steps needs a torch.optim optimizer, not "
                        f"{type(torch_optimizer).__name__}")
    watch = DebugUnderflowOverflow(inner, **options)
    watch._hold_to_step_end = True
    steps = _StepBatches(watch)
    # Before the watchdog's own hook, which would otherwise open a batch for this one forward.
    watch._handles.append(inner.register_forward_pre_hook(steps.begin, prepend=True))
    watch._handles.append(torch_optimizer.register_step_pre_hook(steps.meet))
    watch._handles.append(torch_optimizer.register_step_post_hook(steps.end))
    watch.watch_optimizer(torch_optimizer)
    return watch


class _StepBatches:
    def __init__(self, watch):
        self._watch = watch
        self._open = None

    def begin(self, module, args):
        w = self._watch
        if self._open is None and not w._native.closed and not in_backward():
            self._open = w.batch()
            self._open.__enter__()

    def meet(self, optimizer, args, kwargs):
        if self._open is None or self._watch._native.closed:
            return
        try:
            self._watch._meet_after_backward()
        except BaseException:
            step, self._open = self._open, None
            step.__exit__(*sys.exc_info())  # the step is over: its batch ends with the error
            raise

    def end(self, optimizer, args, kwargs):
        step, self._open = self._open, None
        if step is not None and not self._watch._native.closed:
            step.__exit__(None, None, None)  # raises what the step found

