"""What overflow_sentinel.compare costs against running the two models plainly: transformers'
Llama (random weights from a config) against the port of tests/python/llama_port.py (fused QKV and
gate/up, [seq, batch, hidden]), float32 on the CPU.

Time: rounds in turns (plain reference + candidate forward; the same with backward; compare), the
order rotating each round; the median of each and the ratios. Memory: each case once in a fresh
process, its peak resident set (ru_maxrss) over the process's resident set before it, and the
compare's own peak of float64 reference tensors held in memory (the models are built, and the
package imported, before the resident set is read).

    scripts/python.sh bench/compare_cost.py [--rounds 7] [--layers 4] [--hidden 256] [--seq 256] [--batch 4]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

import torch  # noqa: E402


def build(args):
    import llama_port as lp
    reference = lp.llama(layers=args.layers, hidden=args.hidden, heads=args.hidden // 32,
                         kv_heads=args.hidden // 64, vocab=1000)
    candidate = lp.port_of(reference)
    tokens = torch.randint(0, 1000, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    return lp, reference, candidate, tokens


def cases(args):
    import overflow_sentinel
    lp, reference, candidate, tokens = build(args)

    def plain_forward():
        with torch.no_grad():
            reference(input_ids=tokens)
            candidate(tokens)

    def plain_backward():
        reference(input_ids=tokens).logits.sum().backward()
        candidate(tokens).sum().backward()
        reference.zero_grad(set_to_none=True)
        candidate.zero_grad(set_to_none=True)

    def compare():
        return overflow_sentinel.compare(reference, candidate, {"input_ids": tokens}, lp.MAPPING,
                                         candidate_inputs=(tokens,), activation=lp.ACTIVATION)
    return {"plain forward": plain_forward, "plain forward+backward": plain_backward, "compare": compare}


def memory(args, case):
    """The case's peak resident set over the process's before it, in a fresh process."""
    out = subprocess.run([sys.executable, __file__, "--memory-of", case] + [f"--{k}={getattr(args, k)}" for k in
                         ("layers", "hidden", "seq", "batch")], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--memory-of")
    args = parser.parse_args()
    if args.memory_of:
        run = cases(args)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result = run[args.memory_of]()
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        held = result.memory["peak_bytes_in_memory"] if hasattr(result, "memory") else 0
        print(json.dumps({"peak_rss_growth_mib": (after - before) / 1024, "rss_before_mib": before / 1024,
                          "reference_tensors_held_mib": held / 2 ** 20}))
        return
    run = cases(args)
    names = list(run)
    for name in names:
        run[name]()
    times = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            run[name]()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; Llama {args.layers} layers, "
          f"hidden {args.hidden}, batch {args.batch} x {args.seq} tokens, float32; {args.rounds} rounds")
    for name in names:
        print(f"{name:24} median {medians[name] * 1e3:9.1f} ms   x{medians[name] / medians['plain forward']:6.2f} "
              f"of plain forward   x{medians[name] / medians['plain forward+backward']:6.2f} of plain forward+backward")
    for name in ("plain forward+backward", "compare"):
        print(f"{name:24} memory {memory(args, name)}")


if __name__ == "__main__":
    main()
