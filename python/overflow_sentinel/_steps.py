"""One optimizer step, one batch: the step protocol a plain training loop, Accelerate and FSDP2
share (docs/python.md). The step opens at the first forward after the last one ended (so the
micro-batches of gradient accumulation are one batch), meets before the optimizer writes (an
optimizer step pre-hook: every rank is past the gradient all-reduce or reduce-scatter there, and
what the step found is raised), and ends after the optimizer (its post-hook), before zero_grad."""

import sys

from ._hooks import in_backward


def watch_steps(watch, model, optimizer):
    """Hooks `watch` (a new watchdog over `model`) onto `optimizer`'s steps; returns it."""
    torch_optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper holds it
    if not hasattr(torch_optimizer, "register_step_post_hook"):
        watch.close()
        raise TypeError(f"overflow_sentinel: watch_steps needs a torch.optim optimizer, not "
                        f"{type(torch_optimizer).__name__}")
    watch._hold_to_step_end = True
    steps = _StepBatches(watch)
    # Before the watchdog's own hook, which would otherwise open a batch for this one forward.
    watch._handles.append(model.register_forward_pre_hook(steps.begin, prepend=True))
    watch._handles.append(torch_optimizer.register_step_pre_hook(steps.meet))
    # (Its step post-hook reads what the step wrote, inside the step's batch: before steps.end's.)
    watch.watch_optimizer(torch_optimizer)
    watch._handles.append(torch_optimizer.register_step_post_hook(steps.end))
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
        if self._watch._unsharded.sharded:
            self._watch._unsharded.name_sharded_gradients(self._watch._native)
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
