"""What watching costs Hugging Face's Trainer: a small GPT-2 from `transformers` (4 layers, d_model
256, 4 heads, vocabulary 1000; random weights from a config) trained on the CPU, batch 4 x 128
tokens, Trainer's default AdamW (fused), with clipping at 1.0 (Trainer's default): unwatched, with
`debug="underflow_overflow"` and the sentinel's callback (overflow_sentinel.trainer), and with
`debug="underflow_overflow"` alone (HF's own DebugUnderflowOverflow).

Each round trains three Trainers on fresh models of the same weights, one per case, each in a
thread of its own, and the three take turns step by step: a case's step runs while the other two
wait in a callback at the start of their next step, so the three steps of a turn run within a
fraction of a second of each other on the same machine in the same state, and the ratios are
those of each turn's steps. A step's time is from its turn's start to its next step's start: the
whole loop, the optimizer and Trainer's own work included (the last step, with no next step, is
not timed). The first two steps of each Trainer (the watchdog's setup and first reads) are left
out. The order of the cases rotates from round to round: a step's place in its turn moves its time
by a few percent (two unwatched cases measured this way differ by about 3% whichever goes first),
so the rounds should be a multiple of three. The optimizer step's own time is printed too.

    OPENBLAS_NUM_THREADS=1 scripts/python.sh bench/trainer_gpt2.py [--rounds N] [--steps N]
"""

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import threading
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


class Turns:
    """Lets one of several Trainers, each in its own thread, run a step at a time, in turn."""

    def __init__(self, order):
        self.order = list(order)
        self.current = None
        self.condition = threading.Condition()

    def wait_for(self, case):
        with self.condition:
            self.condition.wait_for(lambda: self.current == case)

    def pass_on(self, case, finished=False):
        """Hands the turn to the case after `case`; a finished case leaves the rotation."""
        with self.condition:
            i = self.order.index(case)
            if finished:
                self.order.pop(i)
                self.current = self.order[i % len(self.order)] if self.order else None
            else:
                self.current = self.order[(i + 1) % len(self.order)]
            self.condition.notify_all()


class StepClock(transformers.TrainerCallback):
    """Takes the turns: at each step's start, hands the turn on and waits for it to come back;
    records each step's time (from its turn's start to the next step's start) and each optimizer
    step's (from on_pre_optimizer_step to on_optimizer_step: the optimizer's own ops, and the
    watchdog's reads of what they wrote)."""

    def __init__(self, case, turns, arrived):
        self.case, self.turns, self.arrived = case, turns, arrived
        self.steps = []
        self.optimizer = []
        self._turn_start = None
        self._before_optimizer = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self._turn_start is None:
            self.arrived.set()  # set up: the next Trainer may start its own
        else:
            self.steps.append(time.perf_counter() - self._turn_start)
            self.turns.pass_on(self.case)
        self.turns.wait_for(self.case)
        self._turn_start = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._before_optimizer = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.optimizer.append(time.perf_counter() - self._before_optimizer)

    def on_train_end(self, args, state, control, **kwargs):
        self.turns.pass_on(self.case, finished=True)


def trainer(case, steps, data, output_dir, clock):
    args = transformers.TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=1e-4,
        save_strategy="no", logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
        debug="" if case == "unwatched" else "underflow_overflow")
    callbacks = [clock, SentinelCallback()] if case == "sentinel" else [clock]
    return transformers.Trainer(model=model(), args=args, train_dataset=data, callbacks=callbacks)


def one_round(order, steps, data, output_dir):
    """Each case's step times and optimizer times, the steps of a turn at the same index."""
    turns = Turns(order)
    clocks, threads, errors = {}, [], []
    # What Trainer prints at the end; sys.stdout is the process's, so it is redirected here, once.
    with contextlib.redirect_stdout(io.StringIO()):
        start_in_turns(order, turns, clocks, threads, errors, steps, data, output_dir)
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return {case: (clocks[case].steps[2:], clocks[case].optimizer[2:]) for case in order}


def start_in_turns(order, turns, clocks, threads, errors, steps, data, output_dir):
    for case in order:
        arrived = threading.Event()
        clocks[case] = StepClock(case, turns, arrived)
        t = trainer(case, steps, data, output_dir, clocks[case])

        def train(t=t, case=case, arrived=arrived):
            try:
                t.train()
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)
                arrived.set()
                turns.pass_on(case, finished=True)

        threads.append(threading.Thread(target=train))
        threads[-1].start()
        arrived.wait()  # one Trainer's setup at a time; each then waits for its first turn
    turns.pass_on(order[-1])  # the first case's turn


def measure(one_round, rounds, steps, root):
    """Runs `rounds` rounds of `one_round(order, steps, data, root)`, the cases' order rotating:
    {case: step seconds}, {case: optimizer seconds}, {watched case: per-turn ratios to unwatched}."""
    data = dataset(BATCH * steps)
    ratios = {case: [] for case in CASES[1:]}
    seconds = {case: [] for case in CASES}
    optimizer_seconds = {case: [] for case in CASES}
    for round_index in range(rounds):
        order = CASES[round_index % 3:] + CASES[:round_index % 3]
        took = one_round(order, steps, data, root)
        for case in CASES:
            seconds[case] += took[case][0]
            optimizer_seconds[case] += took[case][1]
        for case in CASES[1:]:
            ratios[case] += [w / u for w, u in zip(took[case][0], took["unwatched"][0])]
    return seconds, optimizer_seconds, ratios


def print_results(header, optimizer_label, seconds, optimizer_seconds, ratios):
    print(f"{header}, {len(ratios['sentinel'])} turns, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} threads")
    print(f"  unwatched: {statistics.median(seconds['unwatched']) * 1000:.1f} ms per step (median)")
    print(f"  {optimizer_label} (median ms): " +
          ", ".join(f"{case} {statistics.median(optimizer_seconds[case]) * 1000:.2f}" for case in CASES))
    for case in CASES[1:]:
        q = statistics.quantiles(ratios[case], n=4)
        print(f"  {case:9s}: {statistics.median(seconds[case]) * 1000:.1f} ms per step, "
              f"ratio to unwatched median {statistics.median(ratios[case]):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as output_dir:
        results = measure(one_round, args.rounds, args.steps, output_dir)
    print_results(f"Trainer, GPT-2 {LAYERS} layers d_model {MODEL}, batch {BATCH} x {SEQ}, {args.rounds} rounds of "
                  f"{args.steps} steps", "optimizer step", *results)


if __name__ == "__main__":
    main()
