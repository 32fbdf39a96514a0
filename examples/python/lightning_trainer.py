"""A small LightningModule trained with Lightning's Trainer, watched by Overflow Sentinel through one
line: the callback in `callbacks=[...]`.

    scripts/python.sh examples/python/lightning_trainer.py [--steps N] [--plant-at STEP] [--root-dir DIR]

The model (a three-layer MLP on random regression data) is validated every 2 steps and saves a
checkpoint after every step. With --plant-at STEP a weight of its first layer is set to 3e38 when
that step begins: its forward overflows, the report is printed and written to the Trainer's
default_root_dir (sentinel_batch<STEP>.txt, .json), and training stops at that step, before its
optimizer step and before a checkpoint can be saved from the poisoned weights.
Exit status: 0 clean, 3 stopped at an inf/nan.
"""

import argparse
import os
import sys
import tempfile

import lightning.pytorch as pl
import torch
from torch import nn

from overflow_sentinel import NonFiniteError
from overflow_sentinel.lightning import SentinelCallback


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class PlantOverflow(pl.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.net[0].weight.fill_(3e38)


def loader(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.pow(2).sum(1, keepdim=True)), batch_size=8)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--plant-at", type=int, default=None, help="the step whose forward overflows")
    parser.add_argument("--root-dir", default=None,
                        help="the Trainer's default_root_dir (default: a new temporary one)")
    a = parser.parse_args()
    root = a.root_dir or tempfile.mkdtemp(prefix="sentinel_lightning_")

    torch.manual_seed(0)
    callbacks = [SentinelCallback(),  # the one line
                 pl.callbacks.ModelCheckpoint(dirpath=os.path.join(root, "checkpoints"), every_n_train_steps=1,
                                              save_top_k=-1)]
    if a.plant_at is not None:
        callbacks.append(PlantOverflow(a.plant_at))
    trainer = pl.Trainer(default_root_dir=root, max_steps=a.steps, accelerator="cpu", devices=1,
                         val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=2, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    try:
        trainer.fit(Regression(), loader(256, 0), loader(32, 1))
    except NonFiniteError as error:
        kept = sorted(os.listdir(os.path.join(root, "checkpoints")))
        print(f"\nstopped at step {error.report.batch_number}; the report is in {root}; checkpoints kept: {kept}")
        return 3
    print(f"trained {trainer.global_step} steps watched, clean; output in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
