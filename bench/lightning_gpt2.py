"""What watching costs Lightning's Trainer, on the model of bench/trainer_gpt2.py: the same small
GPT-2 from `transformers` (4 layers, d_model 256, 4 heads, vocabulary 1000; random weights from a
config), batch 4 x 128 tokens, AdamW (fused), gradient clipping at 1.0, in a LightningModule whose
training_step returns the model's loss, trained by `lightning.pytorch.Trainer` on the CPU:
unwatched, with the sentinel's callback (overflow_sentinel.lightning), and with Hugging Face's
own DebugUnderflowOverflow put on the GPT-2 model when fitting starts (what
`debug="underflow_overflow"` does under HF's Trainer).

Measured as bench/trainer_gpt2.py measures HF's Trainer (its `Turns` and its model): each round
trains three Trainers on fresh models of the same weights, each in a thread of its own, taking
turns step by step (a callback at each training batch's start hands the turn on and waits for it),
so the ratios are those of steps run within a fraction of a second of each other. A step's time is
from its turn's start to its next step's start; the first two steps of each Trainer and its last
are not timed; the order of the cases rotates from round to round. The optimizer's part is timed
from `on_before_optimizer_step` to `on_train_batch_end`: clipping, the optimizer's update and the
step's end (the sentinel's reads of what they wrote).

    OPENBLAS_NUM_THREADS=1 scripts/python.sh bench/lightning_gpt2.py [--rounds N] [--steps N]
"""

import argparse
import contextlib
import io
import logging
import os
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lightning  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.debug_utils import DebugUnderflowOverflow as HfDebugUnderflowOverflow  # noqa: E402

from overflow_sentinel.lightning import SentinelCallback  # noqa: E402
from trainer_gpt2 import BATCH, HEADS, LAYERS, MODEL, SEQ, Turns, measure, model, print_results  # noqa: E402

logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # each fit's "stopped: max_steps reached"


class LitGPT2(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = model()

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4, weight_decay=0.0, fused=True)


class HfDebug(pl.Callback):
    """HF's class on the GPT-2 model, made when fitting starts (HF's Trainer makes it in train())."""

    def on_fit_start(self, trainer, pl_module):
        self.debug = HfDebugUnderflowOverflow(pl_module.model)


class StepClock(pl.Callback):
    """Takes the turns at each training batch's start; records each step's time and its
    optimizer part's (on_before_optimizer_step to on_train_batch_end)."""

    def __init__(self, case, turns, arrived):
        self.case, self.turns, self.arrived = case, turns, arrived
        self.steps, self.optimizer = [], []
        self._turn_start = self._before_optimizer = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._turn_start is None:
            self.arrived.set()  # set up: the next Trainer may start its own
        else:
            self.steps.append(time.perf_counter() - self._turn_start)
            self.turns.pass_on(self.case)
        self.turns.wait_for(self.case)
        self._turn_start = time.perf_counter()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._before_optimizer = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.optimizer.append(time.perf_counter() - self._before_optimizer)

    def on_train_end(self, trainer, pl_module):
        self.turns.pass_on(self.case, finished=True)


def fit(case, steps, data, root, clock):
    # The clock last: its on_before_optimizer_step runs after the sentinel's meet, its
    # on_train_batch_end after the sentinel has ended the step.
    callbacks = {"unwatched": [], "sentinel": [SentinelCallback()], "hf": [HfDebug()]}[case] + [clock]
    trainer = pl.Trainer(default_root_dir=root, max_steps=steps, accelerator="cpu", devices=1, gradient_clip_val=1.0,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, callbacks=callbacks)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    trainer.fit(LitGPT2(), loader)


def one_round(order, steps, data, root):
    turns = Turns(order)
    clocks, threads, errors = {}, [], []
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for case in order:
            arrived = threading.Event()
            clocks[case] = StepClock(case, turns, arrived)

            def train(case=case, arrived=arrived):
                try:
                    fit(case, steps, data, root, clocks[case])
                except BaseException as e:  # noqa: BLE001 - reported by the main thread
                    errors.append(e)
                    arrived.set()
                    turns.pass_on(case, finished=True)

            threads.append(threading.Thread(target=train))
            threads[-1].start()
            arrived.wait()  # one Trainer's setup at a time; each then waits for its first turn
        turns.pass_on(order[-1])  # the first case's turn
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return {case: (clocks[case].steps[2:], clocks[case].optimizer[2:]) for case in order}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        results = measure(one_round, args.rounds, args.steps, root)
    print_results(f"Lightning {lightning.__version__}, GPT-2 {LAYERS} layers d_model {MODEL} {HEADS} heads, "
                  f"batch {BATCH} x {SEQ}, {args.rounds} rounds of {args.steps} steps",
                  "clipping + optimizer step + step end", *results)


if __name__ == "__main__":
    main()
