"""Hugging Face's Trainer on the sentinel, in one line (docs/python.md):

    trainer = Trainer(model, TrainingArguments(..., debug="underflow_overflow"), ...,
                      callbacks=[overflow_sentinel.trainer.SentinelCallback()])

The callback takes over from HF's DebugUnderflowOverflow, which Trainer builds at every train()
when `debug="underflow_overflow"` (its hooks are removed; without that argument the callback
watches all the same). A Trainer step, every gradient-accumulation micro-batch with its backward,
the clipping and the optimizer step, is one batch, numbered by the Trainer's global step (a run
resumed from a checkpoint goes on from its step). Nothing is raised inside a step: what it found
is raised at its end, before the optimizer step (a non-finite gradient norm at clipping is named
as such), or after it for what the optimizer made, before zero_grad and before a checkpoint can be
saved from poisoned weights. Under DDP every rank gets there past the gradient all-reduce, and the
ranks stop at the same step. Forwards between steps (an evaluation) are watched without moving the
count, and a report of one says it was an evaluation. Reports go to `output_dir` unless
`report_dir=` says otherwise.
"""

import sys

import transformers
from transformers.debug_utils import DebugUnderflowOverflow as _HfDebugUnderflowOverflow
from transformers.training_args import ParallelMode

from . import DebugUnderflowOverflow, _refuse_unknown_options

__all__ = ["SentinelCallback"]


class SentinelCallback(transformers.TrainerCallback):
    """Watches a Trainer's model step by step; keyword arguments are the watchdog's options
    (overflow_sentinel.option_names()). `callback.watch` is the watchdog of the current run."""

    def __init__(self, **options):
        _refuse_unknown_options(options, "SentinelCallback")
        self._options = options
        self.watch = None
        self._step = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if args.n_gpu > 1 and args.parallel_mode == ParallelMode.NOT_DISTRIBUTED:
            raise ValueError("overflow_sentinel: a model replicated by DataParallel across GPUs cannot be watched "
                             "(each replica is a new model, out of reach of its hooks): use DDP (torchrun) instead")
        _remove_hf_hooks(model)
        self._step = None
        self.watch = DebugUnderflowOverflow(model, **{"report_dir": args.output_dir, **self._options})
        self.watch._between_steps_is_evaluation = True
        self.watch._hold_to_step_end = True
        self.watch.batch_number = state.global_step
        if optimizer is not None:
            self.watch.watch_optimizer(optimizer)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.watch is None or self.watch._native.closed:
            return
        self._end_step()  # a step that never reached its optimizer step
        self.watch.batch_number = state.global_step  # forwards since the last step do not count
        self._step = self.watch.batch()
        self._step.__enter__()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        # What the step found so far (its forwards and backwards, a non-finite gradient norm at
        # clipping) is raised before the optimizer can write with it; under DDP every rank is here,
        # past the gradient all-reduce, and all stop at the same step.
        if self._step is not None:
            try:
                self.watch._meet_after_backward()
            except BaseException:
                self._end_step(*sys.exc_info())  # the step is over: its batch ends with the error
                raise

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._end_step()

    def on_train_end(self, args, state, control, **kwargs):
        self._end_step()

    def _end_step(self, *exc):
        step, self._step = self._step, None
        if step is not None:
            step.__exit__(*(exc or (None, None, None)))  # raises what the step found, if nothing else is raised


def _remove_hf_hooks(model):
    """HF's class registers a forward hook on every module (a method of its object): removed, so
    that the sentinel alone watches, and HF's object, held only by them, goes."""
    for module in model.modules():
        for key, hook in list(module._forward_hooks.items()):
            if isinstance(getattr(hook, "__self__", None), _HfDebugUnderflowOverflow):
                del module._forward_hooks[key]
