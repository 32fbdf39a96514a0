"""A small GPT-2 from `transformers` trained with Hugging Face's Trainer, watched by Overflow
Sentinel through one line: the callback in `callbacks=[...]`.

    scripts/python.sh examples/python/trainer_gpt2.py [--steps N] [--plant-at STEP] [--output-dir DIR]

The model is built from a config with random weights (no download). With --plant-at STEP a weight
of the second block's MLP is set to 3e38 when that step begins: its forward overflows, the
report is printed and written to the output directory (sentinel_batch<STEP>.txt, .json), and
training stops at that step's end, before a checkpoint can be saved from the poisoned weights.
Exit status: 0 clean, 3 stopped at an inf/nan.
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from overflow_sentinel import NonFiniteError  # noqa: E402
from overflow_sentinel.trainer import SentinelCallback  # noqa: E402


class PlantOverflow(transformers.TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                model.transformer.h[1].mlp.c_fc.weight.fill_(3e38)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--plant-at", type=int, default=None, help="the step whose forward overflows")
    parser.add_argument("--output-dir", default=None, help="Trainer's output_dir (default: a new temporary one)")
    a = parser.parse_args()
    output_dir = a.output_dir or tempfile.mkdtemp(prefix="sentinel_trainer_")

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=256,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    tokens = torch.randint(1, 256, (64, 32), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in tokens]
    args = transformers.TrainingArguments(
        output_dir=output_dir, max_steps=a.steps, per_device_train_batch_size=4, learning_rate=1e-3,
        save_strategy="steps", save_steps=2, logging_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True, debug="underflow_overflow")
    callbacks = [SentinelCallback()]  # the one line
    if a.plant_at is not None:
        callbacks.append(PlantOverflow(a.plant_at))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    try:
        trainer.train()
    except NonFiniteError as error:
        print(f"\nstopped at step {error.report.batch_number}; the report is in {output_dir}; "
              f"checkpoints kept: {sorted(p for p in os.listdir(output_dir) if p.startswith('checkpoint-'))}")
        return 3
    print(f"trained {trainer.state.global_step} steps watched, clean; output in {output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
