"""Lightning's Trainer on the sentinel, in one line (docs/python.md):

    trainer = lightning.pytorch.Trainer(..., callbacks=[overflow_sentinel.lightning.SentinelCallback()])

The same step semantics as Hugging Face's Trainer under overflow_sentinel.trainer, built from
Lightning's own hooks: Lightning runs `training_step` and the backward inside
`optimizer.step(closure)`, so an optimizer step pre-hook (what `watch_steps` meets in) fires before
the step's forward. A training step, its gradient-accumulation micro-batches with their
backwards, the clipping and the optimizer step, is one batch, numbered by `trainer.global_step`
(which a resumed run restores from its checkpoint). Nothing is raised inside a step: what its
forwards and backwards found is raised at `on_before_optimizer_step`, before the optimizer writes
(under DDP every rank is there, past the gradient all-reduce, and all stop at that step), and what
clipping and the optimizer made at `on_train_batch_end`, before a checkpoint can be saved from the
poisoned weights. Validation, sanity-check, test and prediction batches are watched as batches of
their own, labelled so, numbered by the global step (the steps done so far) without moving the
count. Reports go to the trainer's `default_root_dir` unless `report_dir=` says otherwise.
"""

import sys

import torch
from lightning.pytorch import Callback
from lightning.pytorch.strategies import (DDPStrategy, DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy,
                                          SingleDeviceStrategy, SingleDeviceXLAStrategy, XLAStrategy)

from . import DebugUnderflowOverflow, _refuse_unknown_options
from ._hooks import first_tensor_with_grad

__all__ = ["SentinelCallback"]

# Strategies whose modules run out of reach of the watchdog, and why (the XLA ones derive from the
# two strategies watched, so they are looked at first).
_NOT_WATCHED = (
    ((XLAStrategy, SingleDeviceXLAStrategy),
     "XLA records the model's ops into graphs it compiles and runs later: no op's values exist when it is called"),
    (DeepSpeedStrategy,
     "DeepSpeed's engine runs the backward and the optimizer step itself, over parameters, gradients and "
     "optimizer states it keeps in flat (ZeRO-partitioned) buffers of its own"),
    (FSDPStrategy,
     "FSDP (FullyShardedDataParallel) replaces the modules' parameters by flat parameters it unshards around "
     "each forward; FSDP2 (fully_shard) is watched in a plain training loop with overflow_sentinel.watch_steps"),
    (ModelParallelStrategy,
     "its tensor parallelism runs the modules on DTensors sharded across ranks, which this callback does not "
     "watch; FSDP2 (fully_shard) alone is watched in a plain training loop with overflow_sentinel.watch_steps"),
)


def unwatched_strategy(strategy):
    """Why a Trainer with `strategy` cannot be watched by the callback, or None when it can."""
    name = type(strategy).__name__
    for classes, why in _NOT_WATCHED:
        if isinstance(strategy, classes):
            return f"{name}: {why}"
    if isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)):
        return None
    return (f"{name} is not a strategy it watches: it watches a LightningModule on one device (SingleDeviceStrategy) "
            f"or replicated one per process by DDP (DDPStrategy: 'ddp', 'ddp_spawn', 'ddp_fork', 'ddp_notebook'); "
            f"a strategy that replicates, shards or compiles the modules may run them out of reach of its hooks")


class SentinelCallback(Callback):
    """Watches a Lightning Trainer's LightningModule step by step; keyword arguments are the
    watchdog's options (overflow_sentinel.option_names()). `callback.watch` is the watchdog of the
    current run (closed when the run ends, its report on the exception and on disk)."""

    def __init__(self, **options):
        _refuse_unknown_options(options, "SentinelCallback")
        self._options = options
        self.watch = None
        self._step = None  # the training step's open batch
        self._stepped = False  # whether its optimizer has stepped (it ends at on_train_batch_end)
        self._evaluation = None  # a validation, test or prediction batch's open batch
        self._root_backward = False  # whether the watchdog follows this backward from the model's own call
        self._root_hook = None

    # ---- the run -------------------------------------------------------------------------------

    def setup(self, trainer, pl_module, stage):
        why = unwatched_strategy(trainer.strategy)
        if why is not None:
            raise ValueError(f"overflow_sentinel: SentinelCallback cannot watch this Trainer's strategy, {why}")

    def _start(self, trainer, pl_module):
        """The watchdog, once the strategy has set the model up (wrapped it, made the optimizers;
        modules made in configure_model exist)."""
        if self._live():
            return
        if isinstance(trainer.strategy.model, torch.nn.DataParallel):
            raise ValueError("overflow_sentinel: a model replicated by DataParallel cannot be watched (each replica is "
                             "a new model, out of reach of its hooks): use DDP (strategy='ddp') instead")
        self._step = self._evaluation = None
        self.watch = DebugUnderflowOverflow(pl_module, **{"report_dir": trainer.default_root_dir, **self._options})
        # Forwards outside the batches opened here (a callback's own model call) are not a step.
        self.watch._between_steps_is_evaluation = True
        self.watch._hold_to_step_end = True
        for optimizer in trainer.optimizers:
            self.watch.watch_optimizer(optimizer)
        self._root_hook = pl_module.register_forward_hook(self._note_root_call)

    def on_fit_start(self, trainer, pl_module):
        self._start(trainer, pl_module)

    def teardown(self, trainer, pl_module, stage):
        self._end_step()
        self._close()

    def on_exception(self, trainer, pl_module, exception):
        # The open batch ends under the exception, which goes on (nothing found is raised over
        # it; the sentinel's own error carries its report), and the watchdog closes.
        exc = (type(exception), exception, exception.__traceback__)
        evaluation, self._evaluation = self._evaluation, None
        if evaluation is not None and self._live():
            evaluation.__exit__(*exc)
        self._end_step(*exc)
        self._close()

    def _close(self):
        if self._root_hook is not None:
            self._root_hook.remove()
            self._root_hook = None
        if self.watch is not None:
            self.watch.close()

    def _live(self):
        return self.watch is not None and not self.watch._native.closed

    # ---- training steps ------------------------------------------------------------------------

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._step is None and self._live():  # (else a micro-batch of the open step)
            self._step = self._open(trainer, None)
            self._stepped = False
        self._root_backward = False  # (a call before the training batch is not its forward)

    def _note_root_call(self, module, args, output):
        # A call of the LightningModule itself (DDP's, or `self(x)` in training_step): the watchdog
        # then follows the backward through what it returned already.
        if first_tensor_with_grad(output) is not None:
            self._root_backward = True

    def on_before_backward(self, trainer, pl_module, loss):
        # The parameters' gradients are checked when the backward ends, before DDP's all-reduce
        # writes them (its callback comes after this one's): what the all-reduce brings in is then
        # told from what this rank made, at the step's end. Once a backward: a second check would
        # read them again and close the step's FP8 statistics twice.
        if self._step is not None and not self._root_backward:
            self.watch._watch_backward(loss)
        self._root_backward = False

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        # The step's forwards and backwards are done: the ranks meet, and what was found is raised
        # before the optimizer writes with it. (Lightning clips after this hook, inside the
        # optimizer's step: what clipping and the optimizer make is raised at the step's end.)
        if self._step is None:
            return
        self._stepped = True
        try:
            self.watch._meet_after_backward(loop_ops_done=False)
        except BaseException:
            self._end_step(*sys.exc_info())  # the step is over: its batch ends with the error
            raise

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # After the optimizer (checkpoint callbacks run after every other callback's hook): what the
        # step made is raised before a checkpoint can save it. A micro-batch that only accumulated
        # leaves the step open; under manual optimization a training batch is the step.
        if self._stepped or not pl_module.automatic_optimization:
            self._end_step()

    def on_train_end(self, trainer, pl_module):
        self._end_step()  # a step that never reached its optimizer step

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        # A checkpoint saved by a callback that runs before this one's on_train_batch_end: the step
        # that wrote the weights ends first, raising what it found instead of saving it.
        if self._stepped:
            self._end_step()

    def _end_step(self, *exc):
        step, self._step = self._step, None
        self._stepped = False
        if step is not None and self._live():
            step.__exit__(*(exc or (None, None, None)))  # raises what the step found, if nothing else is raised

    def _open(self, trainer, phase):
        """A batch numbered by the trainer's global step (as it stands after a restore), labelled
        `phase` (None: a training step)."""
        w = self.watch
        w.batch_number = trainer.global_step
        w._step_phase = phase
        batch = w.batch()
        batch.__enter__()
        return batch

    # ---- validation, sanity check, test, prediction --------------------------------------------

    def _open_evaluation(self, trainer, pl_module, phase):
        self._start(trainer, pl_module)  # (trainer.validate, test, predict: the first batch starts it)
        if self._step is None:  # (a validation between micro-batches belongs to their step)
            self._evaluation = self._open(trainer, phase)

    def _end_evaluation(self, trainer):
        evaluation, self._evaluation = self._evaluation, None
        if evaluation is None or not self._live():
            return
        evaluation.__exit__(None, None, None)
        self.watch.batch_number = trainer.global_step  # an evaluation does not move the count

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._open_evaluation(trainer, pl_module, "sanity check" if trainer.sanity_checking else "validation")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._end_evaluation(trainer)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._open_evaluation(trainer, pl_module, "test")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._end_evaluation(trainer)

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._open_evaluation(trainer, pl_module, "prediction")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._end_evaluation(trainer)
