"""What watching costs a Python eager model: the benchmarks' transformer (6 layers, d_model 256, 4
heads, feed-forward 1024, batch 4 x 128 tokens; bench/transformer_model.h) written in Python, its
forward and its training step (forward, loss.backward()), unwatched, watched by
overflow_sentinel.DebugUnderflowOverflow, and under an HF-style Python hook on every module
(abs().min(), abs().max(), isnan().any(), isinf().any() of its parameters, input and output, each
read with .item(), as Hugging Face's class computes). Three copies of one model, each run on a
thread of its own (a backward that no batch is open for is handed to the watchdog that last opened
one on its thread: on one thread, the unwatched model's backward would be watched too), back to
back in a rotating order within each round; each round gives the ratios to the unwatched run, and
the medians and quartiles over the rounds are printed.

    OPENBLAS_NUM_THREADS=1 scripts/python.sh bench/python_eager.py [--rounds N]
"""

import argparse
import copy
import queue
import random
import statistics
import threading
import time

import torch

import overflow_sentinel
from make_bench_models import Encoder  # the model the scripted cases run, here eager

LAYERS, MODEL, HEADS, FEED_FORWARD, BATCH, SEQ = 6, 256, 4, 1024, 4, 128


def hf_style_hooks(model):
    """HF's per-module statistics, each read back to the host."""
    def stats(t):
        a = t.abs()
        return a.min().item() + a.max().item() + float(torch.isnan(t).any().item()) + float(torch.isinf(t).any().item())

    def hook(module, inputs, output):
        with torch.no_grad():
            for p in module.parameters(recurse=False):
                stats(p)
            for t in inputs:
                if isinstance(t, torch.Tensor):
                    stats(t)
            stats(output)

    for m in model.modules():
        m.register_forward_hook(hook)


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class ModeThread:
    """A thread that runs one mode's steps, one at a time, when asked: the watchdog's callbacks
    belong to the threads it watches, and the other modes' threads pay nothing for them."""

    def __init__(self):
        self._jobs, self._results = queue.Queue(), queue.Queue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while (job := self._jobs.get()) is not None:
            try:
                self._results.put(timed(job))
            except BaseException as error:  # noqa: BLE001 - raised again on the caller's thread
                self._results.put(error)

    def timed(self, job):
        self._jobs.put(job)
        result = self._results.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self):
        self._jobs.put(None)
        self._thread.join()


class _CallingThread:
    """ModeThread's interface, run on the calling thread."""

    def timed(self, job):
        return timed(job)

    def close(self):
        pass


def timed_rounds(models, step, rounds, warm_up=False, shuffled=False, on_threads=True):
    """{mode: [seconds]}: each round runs `step` on every model back to back, each model on a
    thread of its own (or, `on_threads` False, all on the calling thread), in a rotating order (no
    mode always runs first), or with `shuffled` in an order shuffled anew each round (no mode
    always follows the same one either); with `warm_up`, one step of each first, untimed."""
    threads = {mode: ModeThread() if on_threads else _CallingThread() for mode in models}
    times = {mode: [] for mode in models}
    order = list(models)
    shuffle = random.Random(0).shuffle
    try:
        if warm_up:
            for mode in order:
                threads[mode].timed(lambda: step(models[mode]))
        for _ in range(rounds):
            if shuffled:
                shuffle(order)
            else:
                order = order[1:] + order[:1]
            for mode in order:
                times[mode].append(threads[mode].timed(lambda: step(models[mode])))
    finally:
        for thread in threads.values():
            thread.close()
    return times


def print_ratios(name, times, baseline, mode_width=10):
    """One row per mode: the median time, and the median and quartiles of its per-round ratios to
    `baseline`'s."""
    for mode in times:
        ratios = [t / u for t, u in zip(times[mode], times[baseline])]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        print(f"{name:<12} {mode:<{mode_width}} {statistics.median(times[mode]) * 1e3:>10.2f} "
              f"{statistics.median(ratios):>7.3f} {q[0]:>6.3f}-{q[2]:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    plain = Encoder(LAYERS, MODEL, HEADS, FEED_FORWARD)
    watched, hf = copy.deepcopy(plain), copy.deepcopy(plain)
    debug = overflow_sentinel.DebugUnderflowOverflow(watched)
    hf_style_hooks(hf)
    x = torch.randn(BATCH, SEQ, MODEL)
    models = {"unwatched": plain, "watched": watched, "hf_style": hf}

    def forward(model):
        with torch.no_grad():
            model(x)

    def train_step(model):
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; {args.rounds} rounds")
    print(f"{'case':<12} {'mode':<10} {'median ms':>10} {'ratio':>7} {'quartiles':>13}")
    for name, step in (("forward", forward), ("train_step", train_step)):
        print_ratios(name, timed_rounds(models, step, args.rounds, warm_up=True), "unwatched")
    debug.close()


if __name__ == "__main__":
    main()
