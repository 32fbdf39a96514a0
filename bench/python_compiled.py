"""What watching costs a torch.compile'd model: the benchmarks' transformer (6 layers, d_model 256,
4 heads, feed-forward 1024, batch 4 x 128 tokens; bench/python_eager.py's) compiled with Inductor,
its training step (forward, loss.backward()) unwatched and watched by overflow_sentinel.Watch, and
the eager step watched for reference. Copies of one model, each run on a thread of its own
(python_eager.py's timed_rounds), back to back in a rotating order within each round; each round
gives the ratios to the unwatched compiled step, and the medians and quartiles over the rounds are
printed, with the memory a watched call keeps for its replay.

    OPENBLAS_NUM_THREADS=1 scripts/python.sh bench/python_compiled.py [--rounds N]
"""

import argparse
import copy
import time

import torch

import overflow_sentinel
from make_bench_models import Encoder
from python_eager import BATCH, FEED_FORWARD, HEADS, LAYERS, MODEL, SEQ, print_ratios, timed_rounds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    plain = Encoder(LAYERS, MODEL, HEADS, FEED_FORWARD)
    watched_eager = copy.deepcopy(plain)
    watched = copy.deepcopy(plain)
    models = {
        "compiled": torch.compile(plain),
        "compiled_watched": torch.compile(watched),
        "eager_watched": watched_eager,
    }
    watches = [overflow_sentinel.Watch(models["compiled_watched"]), overflow_sentinel.Watch(watched_eager)]
    x = torch.randn(BATCH, SEQ, MODEL)

    def train_step(model):
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()

    start = time.perf_counter()
    for model in models.values():
        train_step(model)  # compiles
        train_step(model)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; {args.rounds} rounds; "
          f"compiled and warmed up in {time.perf_counter() - start:.0f} s")
    times = timed_rounds(models, train_step, args.rounds)
    print(f"{'case':<12} {'mode':<18} {'median ms':>10} {'ratio':>7} {'quartiles':>13}")
    print_ratios("train_step", times, "compiled", mode_width=18)
    boundary = watches[0]._boundaries[0]
    kept = sum(c.cpu_rng.numel() for c in boundary._calls)
    print(f"kept for a replay per call: the random-number state ({kept} bytes) and references to the "
          f"input ({x.numel() * x.element_size()} bytes here) and to the gradient at the output, "
          f"until the step's backward is judged")
    for w in watches:
        w.close()


if __name__ == "__main__":
    main()
