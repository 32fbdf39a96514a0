"""What overflow_sentinel.compare costs against running the two models plainly: transformers'
Llama (random weights from a config) against the port of tests/python/llama_port.py (fused QKV and
gate/up, [seq, batch, hidden]), float32 on the CPU.

Time: rounds in turns (plain reference + candidate forward; the same with backward; compare), the
order rotating each round; the median of each and the ratios. Memory: each case once in a fresh
process, the peak of its resident set (sampled every 2 ms from /proc/self/statm) over the resident
set before it (the models built, the package imported), and the compare's own peak of float64
reference tensors held in memory and the bytes it spilled to disk past its cap.

    scripts/python.sh bench/compare_cost.py [--rounds 7] [--layers 4] [--hidden 256] [--seq 256] [--batch 4] [--threads 1]
                                  [--cap-mib 256]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
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
                                         candidate_inputs=(tokens,), activation=lp.ACTIVATION,
                                         memory_cap_bytes=args.cap_mib * 2 ** 20)
    return {"plain forward": plain_forward, "plain forward+backward": plain_backward, "compare": compare}


def rss_mib():
    """The process's resident set now (/proc/self/statm), in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def memory(args, case):
    """The case's peak resident set over the process's before it, in a fresh process."""
    out = subprocess.run([sys.executable, __file__, "--memory-of", case] + [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                         ("layers", "hidden", "seq", "batch", "threads", "cap_mib")], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads (1, as the project's other benchmarks: steadier beside other work)")
    parser.add_argument("--cap-mib", type=int, default=256, help="compare's memory_cap_bytes, in MiB")
    parser.add_argument("--memory-of")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_of:
        run = cases(args)
        before = rss_mib()
        peak = [before]
        done = threading.Event()

        def sample():
            while not done.wait(0.002):
                peak[0] = max(peak[0], rss_mib())
        sampler = threading.Thread(target=sample)
        sampler.start()
        result = run[args.memory_of]()
        done.set()
        sampler.join()
        held = result.memory if hasattr(result, "memory") else {}
        print(json.dumps({"peak_rss_growth_mib": round(peak[0] - before, 1), "rss_before_mib": round(before, 1),
                          "reference_tensors_held_mib": round(held.get("peak_bytes_in_memory", 0) / 2 ** 20, 1),
                          "spilled_mib": round(held.get("bytes_spilled", 0) / 2 ** 20, 1)}))
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
          f"hidden {args.hidden}, batch {args.batch} x {args.seq} tokens, float32; {args.rounds} rounds; "
          f"compare's memory cap {args.cap_mib} MiB")
    for name in names:
        print(f"{name:24} median {medians[name] * 1e3:9.1f} ms   x{medians[name] / medians['plain forward']:6.2f} "
              f"of plain forward   x{medians[name] / medians['plain forward+backward']:6.2f} of plain forward+backward")
    phases = [run["compare"]().seconds for _ in range(3)]
    print("compare's phases, median of 3 (s):",
          {k: round(statistics.median(p[k] for p in phases), 3) for k in phases[0]})
    for name in ("plain forward+backward", "compare"):
        print(f"{name:24} memory {memory(args, name)}")


if __name__ == "__main__":
    main()
