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

from . import DebugUnderflowOverflow
from ._steps import watch_steps as _watch_steps

__all__ = ["watch_steps"]


def watch_steps(accelerator, model, optimizer, **options):
    """Watches `model` (as prepared, or not) step by step; returns the watchdog. `close()` on it
    ends the watching and removes the step hooks."""
    inner = accelerator.unwrap_model(model)
    return _watch_steps(DebugUnderflowOverflow(inner, **options), inner, optimizer)
