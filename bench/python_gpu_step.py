"""What watching costs a Python model on a GPU: Hugging Face's GPT2LMHeadModel at GPT-2 small's
shape (12 layers, d_model 768, 12 heads, vocabulary 50257; random weights from a config, no hub),
in bfloat16, batch 8 x 512 tokens, fused AdamW: the training step (zero_grad, forward with the
labels' loss, backward, optimizer step) and the inference forward, eager and torch.compile'd,
each unwatched and watched by overflow_sentinel.Watch. The models are copies of one model, run
back to back in a rotating order within each round after a warm-up (compilation included); each
round gives every case's ratio to its unwatched twin, and the medians and quartiles over the rounds
are printed. A step is timed from its start to the end of a device synchronisation.

    scripts/python.sh bench/python_gpu_step.py [--rounds N] [--no-compile]
    scripts/python.sh bench/python_gpu_step.py --device cpu --tiny --rounds 2   # a smoke test
"""

import argparse
import copy
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import overflow_sentinel  # noqa: E402
from python_eager import print_ratios  # noqa: E402


def gpt2(tiny):
    torch.manual_seed(0)
    shape = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512) if tiny else {}
    config = transformers.GPT2Config(n_positions=1024, bos_token_id=0, eos_token_id=0, **shape)
    config._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(config)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="2 layers, d_model 64, batch 2 x 32: a smoke test")
    parser.add_argument("--no-compile", action="store_true", help="eager cases only")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    batch, seq = (2, 32) if args.tiny else (8, 512)

    base = gpt2(args.tiny).to(device=device, dtype=dtype)
    kinds = ["eager"] + ([] if args.no_compile else ["compiled"])
    models, watches, optimizers = {}, [], {}
    for kind in kinds:
        for watched in (False, True):
            model = copy.deepcopy(base)
            name = f"{kind}{'_watched' if watched else ''}"
            optimizers[name] = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
            models[name] = torch.compile(model) if kind == "compiled" else model
            if watched:
                watches.append(overflow_sentinel.Watch(models[name]))
    ids = torch.randint(1, base.config.vocab_size, (batch, seq), device=device)

    def train_step(name):
        model = models[name]
        optimizers[name].zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizers[name].step()

    def forward(name):
        with torch.no_grad():
            models[name](input_ids=ids)

    def timed(step, name):
        synchronize(device)
        start = time.perf_counter()
        step(name)
        synchronize(device)
        return time.perf_counter() - start

    start = time.perf_counter()
    for step in (train_step, forward):
        for name in models:
            for _ in range(3):
                step(name)  # compiles, makes the optimizer's state and the watchdog's device ring
    synchronize(device)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'the CPU'}; "
          f"{dtype}; batch {batch} x {seq}; {args.rounds} rounds; warmed up in {time.perf_counter() - start:.0f} s")
    print(f"{'case':<12} {'mode':<18} {'median ms':>10} {'ratio':>7} {'quartiles':>13}")
    for case, step in (("train_step", train_step), ("forward", forward)):
        for kind in kinds:
            pair = [kind, f"{kind}_watched"]
            times = {name: [] for name in pair}
            for r in range(args.rounds):
                for name in pair[r % 2:] + pair[:r % 2]:
                    times[name].append(timed(step, name))
            print_ratios(case, times, kind, mode_width=18)
    for w in watches:
        w.close()


if __name__ == "__main__":
    main()
