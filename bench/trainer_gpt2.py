"""What watching costs Hugging Face's Trainer: a small GPT-2 from `transformers` (4 layers, d_model
256, 4 heads, vocabulary 1000; random weights from a config) trained on the CPU, batch 4 x 128
tokens, Trainer's default AdamW (fused), with clipping at 1.0 (Trainer's default): unwatched, with
`debug="underflow_overflow"` and the sentinel's callback (overflow_sentinel.trainer), and with
`debug="underflow_overflow"` alone (HF's own DebugUnderflowOverflow). Each case is one
`trainer.train()` of --steps steps on a fresh model of the same weights, timed step by step (from
one step's start to the next's: the whole loop, optimizer and Trainer's own work included); a
case's time is the median of its steps after the first two (the watchdog's setup and first
reads), and the optimizer step's own time is printed too. The cases run back to back in a
rotating order within each round (after one warm-up round); each round gives the ratios to the
unwatched run, and the medians and quartiles over the rounds are printed.

    OPENBLAS_NUM_THREADS=1 scripts/python.sh bench/trainer_gpt2.py [--rounds N] [--steps N]
"""

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from overflow_sentinel.trainer import SentinelCallback  # noqa: E402

LAYERS, MODEL, HEADS, VOCAB, BATCH, SEQ = 4, 256, 4, 1000, 4, 128
CASES = ("unwatched", "sentinel", "hf")


def model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=LAYERS, n_embd=MODEL, n_head=HEADS, n_positions=SEQ, vocab_size=VOCAB,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def dataset(n):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


class StepClock(transformers.TrainerCallback):
    """Each step's start, and how long each optimizer step took (from on_pre_optimizer_step to
    on_optimizer_step: the optimizer's own ops, and the watchdog's reads of what they wrote)."""

    def __init__(self):
        self.starts = []
        self.optimizer = []
        self._before_optimizer = None

    def on_step_begin(self, args, state, control, **kwargs):
        self.starts.append(time.perf_counter())

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._before_optimizer = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.optimizer.append(time.perf_counter() - self._before_optimizer)

    def on_train_end(self, args, state, control, **kwargs):
        self.starts.append(time.perf_counter())


def step_seconds(case, steps, data, output_dir):
    args = transformers.TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=1e-4,
        save_strategy="no", logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
        debug="" if case == "unwatched" else "underflow_overflow")
    clock = StepClock()
    callbacks = [SentinelCallback(), clock] if case == "sentinel" else [clock]
    trainer = transformers.Trainer(model=model(), args=args, train_dataset=data, callbacks=callbacks)
    with contextlib.redirect_stdout(io.StringIO()):  # what Trainer prints at the end
        trainer.train()
    intervals = [b - a for a, b in zip(clock.starts, clock.starts[1:])]
    return statistics.median(intervals[2:]), statistics.median(clock.optimizer[2:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    data = dataset(BATCH * args.steps)
    ratios = {case: [] for case in CASES[1:]}
    seconds = {case: [] for case in CASES}
    optimizer_seconds = {case: [] for case in CASES}
    with tempfile.TemporaryDirectory() as output_dir:
        for round_index in range(args.rounds + 1):
            order = CASES[round_index % 3:] + CASES[:round_index % 3]
            took = {case: step_seconds(case, args.steps, data, output_dir) for case in order}
            if round_index == 0:
                continue  # warm-up
            for case in CASES:
                seconds[case].append(took[case][0])
                optimizer_seconds[case].append(took[case][1])
            for case in CASES[1:]:
                ratios[case].append(took[case][0] / took["unwatched"][0])
    print(f"Trainer, GPT-2 {LAYERS} layers d_model {MODEL}, batch {BATCH} x {SEQ}, {args.steps} steps per train(), "
          f"{args.rounds} rounds, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"  unwatched: {statistics.median(seconds['unwatched']) * 1000:.1f} ms per step (median)")
    print("  optimizer step (median ms): " +
          ", ".join(f"{case} {statistics.median(optimizer_seconds[case]) * 1000:.2f}" for case in CASES))
    for case in CASES[1:]:
        q = statistics.quantiles(ratios[case], n=4) if len(ratios[case]) > 1 else ratios[case] * 3
        print(f"  {case:9s}: {statistics.median(seconds[case]) * 1000:.1f} ms per step, "
              f"ratio to unwatched median {statistics.median(ratios[case]):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f})")


if __name__ == "__main__":
    main()
