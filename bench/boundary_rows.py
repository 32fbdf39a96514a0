"""What watching at module boundaries costs, one layer at a time, against op-level watching
(`exact`) and Hugging Face's class: the rows the boundary tier is designed from, and the tier.

Two training steps (forward, backward, clipping at 1.0, AdamW), each on copies of one model:
the benchmarks' eager transformer (bench/python_eager.py's, 6 layers, d_model 256, batch 4 x 128)
and the GPT-2 of bench/trainer_gpt2.py (4 layers, d_model 256, vocabulary 1000, batch 4 x 128, in a
plain loop doing what Trainer's step does: fused AdamW, clip_grad_norm_). Each case adds one layer
to the one before it:

  hooks       a forward pre-hook and post-hook on every module, doing no reading: what being
              observed per module costs in Python (no RecordFunction callback is installed)
  +outputs    the post-hooks read what each module returns, and the root pre-hook the model's
              inputs, with the watchdog's own pass (overflow_sentinel._native.count_nonfinite)
  +gradients  the parameters' gradients read after the backward
  +optimizer  what the optimizer wrote read after its step: the parameters and its states
  boundary    overflow_sentinel.watch_steps(exact=False): the boundary tier, what the rows above
              add up to, done by the watchdog (module frames, gradients, the optimizer's writes)
  exact       overflow_sentinel.watch_steps(exact=True): every op watched
  hf          transformers' DebugUnderflowOverflow: every module's parameters, inputs and outputs
  control     unwatched again: how far two identical cases differ here (the noise floor, and the
              bias of a case's place in the rotation)

and, per module call, on a stack of 256 tiny Linear(8, 8) modules (batch 1: the modules' own
work is next to nothing), the forward's host time per call for hooks and for hooks that read.

Each case runs on a thread of its own (the watchdog's callbacks belong to the threads it watches),
the cases back to back within a round, in an order shuffled anew each round (a case that always
followed the same one would carry what that one left in the caches); a round's ratios are to the
unwatched step of the same round. Printed per case: the median time, the median ratio and its 95% confidence
interval (order statistics of the rounds' ratios, distribution-free), whose width says whether the
rounds were enough (a row is meant to be known within 2 points).

    OPENBLAS_NUM_THREADS=1 scripts/python.sh bench/boundary_rows.py [--rounds N]
"""

import argparse
import copy
import math
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import overflow_sentinel  # noqa: E402
from overflow_sentinel import _native  # noqa: E402
from make_bench_models import Encoder  # noqa: E402
from python_eager import BATCH, FEED_FORWARD, HEADS, LAYERS, MODEL, SEQ, timed_rounds  # noqa: E402

ROWS = ("unwatched", "control", "hooks", "+outputs", "+gradients", "+optimizer", "boundary", "exact", "hf")
LAYERED = ROWS[2:6]  # the rows this script's own hooks make
GPT2_LAYERS, VOCAB = 4, 1000


def tensors_in(value, found, depth=0):
    """The tensors of a module's output: a tensor, a tuple or list, a dict or a ModelOutput."""
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif depth < 4 and isinstance(value, (tuple, list)):
        for item in value:
            tensors_in(item, found, depth + 1)
    elif depth < 4 and isinstance(value, dict):
        for item in value.values():
            tensors_in(item, found, depth + 1)
    return found


class Rows:
    """One case's model, optimizer and the layers it adds to the plain step."""

    def __init__(self, model, row):
        self.model = model
        self.row = row
        self.level = ROWS.index(row) if row in LAYERED else 0
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        self.found = 0  # what the reads found: kept, so that nothing is optimised away
        if row in ("boundary", "exact"):
            overflow_sentinel.watch_steps(model, self.optimizer, exact=row == "exact")
        elif row == "hf":
            from transformers.debug_utils import DebugUnderflowOverflow
            DebugUnderflowOverflow(model)
        elif self.level >= ROWS.index("hooks"):
            for module in model.modules():
                module.register_forward_pre_hook(self._pre)
                module.register_forward_hook(self._post)

    def _pre(self, module, args):
        if self.level >= ROWS.index("+outputs") and module is self.model:
            self.found += _native.count_nonfinite(tensors_in(args, []))

    def _post(self, module, args, output):
        if self.level >= ROWS.index("+outputs"):
            self.found += _native.count_nonfinite(tensors_in(output, []))

    def step(self, loss_of):
        loss = loss_of(self.model)
        loss.backward()
        if self.level >= ROWS.index("+gradients"):
            self.found += _native.count_nonfinite([p.grad for p in self.model.parameters() if p.grad is not None])
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        if self.level >= ROWS.index("+optimizer"):
            written = list(self.model.parameters())
            written += [t for state in self.optimizer.state.values() for t in state.values()
                        if isinstance(t, torch.Tensor) and t.dim() > 0]
            self.found += _native.count_nonfinite(written)
        self.optimizer.zero_grad(set_to_none=True)


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=GPT2_LAYERS, n_embd=MODEL, n_head=HEADS, n_positions=SEQ,
                                     vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def median_interval(ratios, confidence=0.95):
    """The median of `ratios` and a distribution-free interval for it: the order statistics j, k
    with P(j <= rank of the median < k) >= confidence under Binomial(n, 1/2)."""
    xs = sorted(ratios)
    n = len(xs)
    tail = (1 - confidence) / 2
    below, j = 0.0, 0  # P(Binomial <= j - 1), the chance the j-th smallest lies above the median
    while below + math.comb(n, j) / 2**n <= tail:
        below += math.comb(n, j) / 2**n
        j += 1
    j = max(j, 1)  # (too few rounds: the interval is the whole range)
    return statistics.median(xs), xs[j - 1], xs[n - j]


def measure(name, make, loss_of, rounds, on_threads=True):
    base = make()
    # On one thread, exact mode's op callback would stay installed there after its step (it is
    # removed only once no scope is open, and the optimizer's step scope is) and every other case
    # would pay for it: it runs only on a thread of its own.
    rows = ROWS if on_threads else tuple(row for row in ROWS if row != "exact")
    cases = {row: Rows(copy.deepcopy(base), row) for row in rows}
    times = timed_rounds(cases, lambda case: case.step(loss_of), rounds, warm_up=True, shuffled=True,
                         on_threads=on_threads)
    print(f"{name}: {rounds} rounds, {'a thread per case' if on_threads else 'every case on the main thread'}")
    print(f"  {'case':<11} {'median ms':>9} {'ratio':>7}  95% interval   width")
    for row in rows:
        ratios = [t / u for t, u in zip(times[row], times["unwatched"])]
        median, low, high = median_interval(ratios)
        print(f"  {row:<11} {statistics.median(times[row]) * 1e3:>9.2f} {median:>7.3f}  "
              f"{low:.3f}-{high:.3f}  {(high - low) * 100:4.1f} pt")
    if any(case.found for case in cases.values()):
        print("  (a read found inf/nan: the rows are not of a clean run)")


def per_module_call(rounds, calls=256):
    """µs per module call: hooks doing nothing, hooks reading the call's output, the boundary tier
    and exact mode, over a forward of `calls` tiny modules (their own work measured and subtracted)."""
    torch.manual_seed(0)
    x = torch.randn(1, 8)
    watched = ("hooks", "+outputs", "boundary", "exact")
    stacks = {row: torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(calls)])
              for row in ("none",) + watched}
    for row in ("hooks", "+outputs"):
        case = Rows.__new__(Rows)
        case.model, case.row, case.level, case.found = stacks[row], row, ROWS.index(row), 0
        for module in stacks[row]:  # (the stack itself: not a call of the model's modules)
            module.register_forward_pre_hook(case._pre)
            module.register_forward_hook(case._post)
    watches = [overflow_sentinel.Watch(stacks[row], exact=row == "exact") for row in ("boundary", "exact")]

    def forward(model):
        with torch.no_grad():
            model(x)

    times = timed_rounds(stacks, forward, rounds, warm_up=True, shuffled=True)
    base = statistics.median(times["none"])
    print(f"per module call ({calls} Linear(8, 8), batch 1; {rounds} rounds): a call alone "
          f"{base / calls * 1e6:.1f} µs")
    for row in watched:
        extra = [(t - u) / calls * 1e6 for t, u in zip(times[row], times["none"])]
        median, low, high = median_interval(extra)
        print(f"  {row:<11} +{median:.1f} µs a call (95% interval {low:.1f}-{high:.1f})")
    for w in watches:
        w.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--case", choices=("transformer", "gpt2", "calls", "all"), default="all")
    parser.add_argument("--main-thread", action="store_true",
                        help="every case on the main thread, as a training script runs (ATen's OpenMP "
                             "regions cost several times more on a thread of their own)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    x = torch.randn(BATCH, SEQ, MODEL, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    if args.case in ("calls", "all"):
        per_module_call(args.rounds)
    if args.case in ("transformer", "all"):
        measure(f"eager transformer ({LAYERS} layers), training step",
                lambda: Encoder(LAYERS, MODEL, HEADS, FEED_FORWARD), lambda m: m(x).pow(2).mean(), args.rounds,
                not args.main_thread)
    if args.case in ("gpt2", "all"):
        measure(f"GPT-2 ({GPT2_LAYERS} layers), Trainer's step in a plain loop", gpt2,
                lambda m: m(input_ids=ids, labels=ids).loss, args.rounds, not args.main_thread)


if __name__ == "__main__":
    main()
