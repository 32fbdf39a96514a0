"""The drop-in against Hugging Face's own DebugUnderflowOverflow on `transformers`' own models (small
configs, random weights, no hub): the same batches with an overflow planted in a weight, both must
stop in the same batch; for every module frame HF prints of a module that finished before ours
stopped, ours holds op frames of that module (or its sub-modules) with the same parameter, input and
output abs-min/abs-max at HF's printed precision; ours stops at the module HF stops at (where the
value leaves the module that made it) and names the op that made it; clean runs stop neither. T5's
intended log(0) = -inf in its relative-position buckets stays inside its attention: tolerated. Where
HF prints "not a tensor" (a ModelOutput, a Cache), ours names the tensors inside."""

import contextlib
import io
import os
import re

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
from transformers.debug_utils import DebugUnderflowOverflow as HfDebug  # noqa: E402

import overflow_sentinel  # noqa: E402
from tiers import both_tiers, named  # noqa: E402

SMALL = dict(vocab_size=100)


def gpt2():
    c = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, bos_token_id=0, eos_token_id=0, **SMALL)
    return transformers.GPT2LMHeadModel(c), lambda m: m.transformer.h[1].mlp.c_fc.weight.mul_(1e37)


def t5():
    c = transformers.T5Config(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
                              decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, **SMALL)
    return transformers.T5EncoderModel(c), lambda m: m.encoder.block[1].layer[1].DenseReluDense.wi_1.weight.fill_(3e38)


def llama():
    c = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=2, max_position_embeddings=16, bos_token_id=0, eos_token_id=0,
                                 pad_token_id=0, **SMALL)
    # RMSNorm turns a merely huge value back into a finite one (x * rsqrt(inf) = 0): the projection
    # itself must overflow for HF's module boundaries to see an inf.
    return transformers.LlamaModel(c), lambda m: m.layers[1].mlp.up_proj.weight.fill_(3e38)


def bert():
    c = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                max_position_embeddings=16, pad_token_id=0, **SMALL)
    return transformers.BertModel(c, add_pooling_layer=False), lambda m: m.encoder.layer[1].intermediate.dense.weight.mul_(1e37)


def vit():
    c = transformers.ViTConfig(image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64)
    return transformers.ViTModel(c, add_pooling_layer=False), lambda m: m.layers[1].mlp.fc1.weight.mul_(1e37)


MODELS = {"gpt2": gpt2, "t5": t5, "llama": llama, "bert": bert, "vit": vit}

def batch_for(name, seed):
    g = torch.Generator().manual_seed(seed)
    if name == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=g)}
    return {"input_ids": torch.randint(2, 100, (2, 8), generator=g)}


def run(name, watcher, planted):
    """Two batches through a fresh model (the same weights each time) watched by `watcher`; the
    second after a weight was made to overflow when `planted`. Returns what it printed and raised."""
    torch.manual_seed(0)
    model, plant = MODELS[name]()
    model.eval()
    printed = io.StringIO()
    raised = None
    with contextlib.redirect_stdout(printed):
        debug = watcher(model, max_frames_to_save=100000)
        try:
            with torch.no_grad():
                model(**batch_for(name, 1))
                if planted:
                    plant(model)
                model(**batch_for(name, 2))
        except ValueError as error:
            raised = error
    if isinstance(debug, overflow_sentinel.Watch):
        debug.close()
    return printed.getvalue(), raised


HEADER = re.compile(r"^ {18}(\S+) (\S+)$")
NUMBERS = re.compile(r"^(\S+) (\S+) (\S+)$")


def hf_frames(text, batch):
    """HF's module frames of `batch`, in the order the modules finished: (path, class, entries),
    each entry (label, abs min, abs max) as printed, or (label, None, None) for 'None' and
    'not a tensor'."""
    text = text[text.rindex(f"*** Starting batch number={batch} ***"):]
    frames = []
    for line in text.splitlines()[2:]:
        header = HEADER.match(line)
        if header:
            frames.append((header.group(1), header.group(2), []))
        elif frames and NUMBERS.match(line):
            low, high, label = NUMBERS.match(line).groups()
            frames[-1][2].append((label, low, high))
        elif frames and line.strip():
            frames[-1][2].append((line.split()[-1], None, None))
    return frames


def printed(value):
    return f"{value:8.2e}".strip()


def inside(path, module):
    return path == module or path.startswith(module + ".")


@both_tiers
@pytest.mark.parametrize("name", sorted(MODELS))
def test_both_stop_in_the_same_batch_and_ours_holds_every_value_hf_prints(name, capsys, tier):
    hf_text, hf_error = run(name, HfDebug, planted=True)
    _, our_error = run(name, overflow_sentinel.DebugUnderflowOverflow, planted=True)
    assert hf_error is not None, f"{name}: HF's class did not stop on the planted overflow"
    assert isinstance(our_error, overflow_sentinel.NonFiniteError), f"{name}: ours did not stop ({our_error!r})"
    hf_batch = int(re.search(r"Detected inf/nan during batch_number=(\d+)", hf_text).group(1))
    if tier == "boundary":
        module_frames_equal_hfs(name, hf_text, hf_batch, our_error.report)
    report = named(our_error)
    assert report.batch_number == hf_batch == 1

    frames = hf_frames(hf_text, hf_batch)
    hf_stop = frames[-1][0]  # the module whose frame HF stopped at
    trigger = report.trigger.module_path
    order = [path for path, _, _ in frames]
    # Ours stops at or before the module HF stops at: inside it, or in a module that finished first.
    assert inside(trigger, hf_stop) or any(inside(trigger, p) for p in order[: order.index(hf_stop)]), (
        f"{name}: ours stopped in {trigger}, after HF's {hf_stop}")
    # The place rule stops where the value leaves the module that made it: at HF's very module,
    # its forward returning it, with the op that made it named (or strictly at that op itself).
    assert (trigger == hf_stop and report.trigger.op == "return") or report.produced_here, (
        f"{name}: ours stopped at {report.trigger}, HF at {hf_stop}")
    assert report.origin_frame is None or inside(report.origin_frame.module_path, hf_stop) or any(
        inside(report.origin_frame.module_path, p) for p in order[: order.index(hf_stop)])

    ours = [f for f in report.frames if f.batch_number == hf_batch and f.direction == "forward"]
    # The modules that finished before ours stopped: HF's frames before the frame of the module
    # ours stopped in (or of its innermost finished ancestor), leaving out its ancestors.
    stop_at = next(i for i, p in enumerate(order) if inside(trigger, p))
    def values_of(entries):
        return {(printed(e.stats.abs_min), printed(e.stats.abs_max)) for e in entries if getattr(e, "stats", None)}

    def made_before(module):
        first = next((i for i, f in enumerate(ours) if inside(f.module_path, module)), len(ours))
        return values_of([e for f in ours[:first] for e in f.entries if e.role == "output"])

    compared = equal = frames_compared = held_where_made = 0
    missing = []
    for path, cls, entries in frames[:stop_at]:
        if inside(trigger, path):
            continue
        mine = [f for f in ours if inside(f.module_path, path)]
        if not mine:
            if any(low is not None for _, low, _ in entries) and cls not in ("Identity",):
                missing.append(f"{path} {cls}: no op frame")
            continue
        frames_compared += 1
        for label, low, high in entries:
            if low is None:
                continue  # HF's 'None' / 'not a tensor'
            if label.startswith("input"):
                pool = [e for f in mine for e in f.entries if e.role == "input"]
            elif label.startswith("output"):
                pool = [e for f in mine for e in f.entries if e.role == "output"]
            else:  # a parameter of this very module, by its name
                pool = [e for f in mine if f.module_path == path for e in f.entries
                        if e.role == "parameter" and e.label == label]
            compared += 1
            if (low, high) in values_of(pool):
                equal += 1
            elif (low, high) in made_before(path):
                # An input no op of the module reads (rotary embeddings take the hidden states for
                # their dtype only), or one it returns as it came (T5 hands its position bias from
                # block to block): ours holds it where it was made, as an earlier op's output.
                equal += 1
                held_where_made += 1
            else:
                missing.append(f"{path} {cls} {label}: HF {low} {high}, ours {sorted(values_of(pool))[:3]}")
    print(f"{name}: batch {hf_batch}, {frames_compared} module frames compared, {equal} of {compared} entries equal "
          f"({held_where_made} held where they were made); HF stopped at {hf_stop}, ours at {report.trigger}")
    assert frames_compared >= 5
    assert not missing, f"{name}:\n" + "\n".join(missing)


def module_frames_equal_hfs(name, hf_text, batch, report):
    """The boundary tier's frames are HF's, entry for entry: the same modules in the same order up to
    the one both stop at, each with the same parameters, inputs and outputs at HF's precision (what
    HF prints as 'None' or 'not a tensor' aside: ours names the tensors inside)."""
    hf = hf_frames(hf_text, batch)
    ours = [f for f in report.frames if f.batch_number == batch and f.op == "forward"]
    assert [(f.module_path, f.module_class) for f in ours] == [(path, cls) for path, cls, _ in hf], name
    for (path, cls, entries), frame in zip(hf, ours):
        mine = {e.label: (printed(e.stats.abs_min), printed(e.stats.abs_max)) for e in frame.entries
                if getattr(e, "stats", None)}
        for label, low, high in entries:
            if low is not None:
                assert mine.get(label) == (low, high), f"{name}: {path} {cls} {label}: HF {low} {high}, ours {mine}"
    assert report.trigger.module_path == hf[-1][0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_clean_run_stops_neither(name):
    _, hf_error = run(name, HfDebug, planted=False)
    _, our_error = run(name, overflow_sentinel.DebugUnderflowOverflow, planted=False)
    assert hf_error is None and our_error is None


def tensor_paths(value, path):
    """The paths a user types to reach the tensors in what a module of `transformers` was handed
    or returned: a ModelOutput's fields, a Cache's keys and values per layer, tuples by index."""
    if isinstance(value, torch.Tensor):
        return {path}
    if isinstance(value, (tuple, list)):
        return set().union(*[tensor_paths(item, f"{path}[{i}]") for i, item in enumerate(value)])
    if isinstance(value, transformers.utils.ModelOutput):
        return set().union(*[tensor_paths(item, f"{path}.{key}") for key, item in value.items()])
    if isinstance(value, transformers.Cache):
        return set().union(*[tensor_paths(getattr(layer, part), f"{path}.layers[{i}].{part}")
                             for i, layer in enumerate(value.layers) for part in ("keys", "values")])
    return set()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_where_hf_prints_not_a_tensor_ours_names_the_tensors_inside(name):
    kwargs = dict(batch_for(name, 1), **({"use_cache": True} if name in ("gpt2", "llama") else {}))
    torch.manual_seed(0)
    model, _ = MODELS[name]()
    text = io.StringIO()
    with contextlib.redirect_stdout(text), torch.no_grad():
        HfDebug(model.eval(), trace_batch_nums=[0])
        model(**kwargs)
    # HF's "not a tensor" entries: (module path, label).
    header = re.compile(r"^ {18}(\S*) (\S+)$")
    opaque, module = [], None
    for line in text.getvalue().splitlines():
        if header.match(line):
            module = header.match(line).group(1)
        elif line.strip().startswith("not a tensor"):
            opaque.append((module, line.split()[-1]))
    assert opaque, f"{name}: HF printed no 'not a tensor'"

    torch.manual_seed(0)
    model, _ = MODELS[name]()
    model.eval()
    ours = overflow_sentinel.DebugUnderflowOverflow(model, max_frames_to_save=100000, exact=True)  # (call and return frames)
    # The values of the tensors each module was handed and returned, read then (a cache grows later).
    seen = {}

    def snapshot(path, side, value):
        if side not in seen.setdefault(path, {}):
            reached = {p: eval(p, {side: value}).double().abs() for p in tensor_paths(value, side)}  # noqa: S307
            seen[path][side] = {p: (t.min().item(), t.max().item()) for p, t in reached.items()}

    for path, sub in model.named_modules():
        sub.register_forward_pre_hook(lambda m, args, path=path: snapshot(path, "input", args))
        sub.register_forward_hook(lambda m, args, out, path=path: snapshot(path, "output", out))
    with torch.no_grad():
        model(**kwargs)
    frames = [f for f in ours.saved_frames() if f.op in ("call", "return")]
    ours.close()

    named = values = 0
    for path, label in opaque:
        side = "input" if label.startswith("input") else "output"
        expected = {p for p in seen[path][side] if p.startswith(label + ".") or p.startswith(label + "[")}
        if not expected:
            continue
        op = "call" if side == "input" else "return"
        mine = {e.label for f in frames if f.module_path == path and f.op == op for e in f.entries}
        if side == "input":
            # A cache handed from layer to layer is read where it is first met in the batch.
            earlier = frames[: max((i for i, f in enumerate(frames) if f.module_path == path), default=-1) + 1]
            mine |= {label + e.label.split("]", 1)[1] for f in earlier if f.op == "call" for e in f.entries
                     if e.label.startswith("input[") and "." in e.label}
        assert expected <= mine, f"{name}: {path or 'the model'} {label}: ours lacks {sorted(expected - mine)}"
        named += len(expected)
    # Each named entry holds the values of the tensor its path reaches, as the module saw it.
    for f in frames:
        side = "input" if f.op == "call" else "output"
        for e in f.entries:
            assert (e.stats.abs_min, e.stats.abs_max) == seen[f.module_path][side][e.label], (
                f"{name}: {f.module_path} {e.label}")
            values += 1
    print(f"{name}: {len(opaque)} 'not a tensor' entries of HF's, {named} tensors inside named by ours, "
          f"{values} named values equal")
    assert named > 0
