#!/usr/bin/env python3
"""Write a zoo of scripted torchvision classifiers, with overflowing twins.

The zoo tests the watchdog against real model code: the TorchScript
archives are genuine Python output (torch.jit.script + torch.jit.save of
torchvision's own model classes), and the expected results come from a
Python run of the same models with Hugging Face's detection method
(DebugUnderflowOverflow: forward hooks on every module).

Usage:

    scripts/python.sh tests/zoo/make_zoo.py OUT_DIR [model ...]

With no model names, every model in MODELS is written.  For each model NAME
the script writes into OUT_DIR (and nowhere else):

    NAME.pt           torch.jit.save(torch.jit.script(model)), eval() mode,
                      random weights from torch.manual_seed(0); BatchNorm
                      running statistics calibrated on one random batch (see
                      calibrate_batchnorm)
    NAME_overflow.pt  the same model and weights, except that one Conv2d or
                      Linear about 2/3 of the way through named_modules() has
                      its weight scaled so that its largest entry is 3e38:
                      every weight stays finite, but float32 overflows to inf
                      in that layer (or shortly after)
    NAME_inputs.pt    torch.save([(x0,), (x1,), (x2,)]): three finite float32
                      batches of shape (2, 3, H, W), from torch.manual_seed(1)
    NAME_bad_inputs.pt  the same batches, but batch 1 holds one inf pixel: a bad
                      batch for the clean model
    NAME.json         named_modules(), the constructor, the input shape, the
                      overflowing layer, the Python (HF-style) detection
                      result on the overflow model and on the bad batch, and
                      more (see README.md)

and an index, zoo.json, listing the models written and those skipped (a
model that torch.jit.script rejects is skipped, with the reason).

Models are the classes of torchvision's classification zoo.  Where the zoo
model is large, the same class is built directly with a smaller
configuration (fewer blocks, narrower layers): the module classes and code
paths are those of the zoo model; the "constructor" field of NAME.json is
the exact Python expression used.

Everything is deterministic: weights and inputs come from fixed seeds, and
the script re-runs itself with PYTHONHASHSEED=0 (TorchScript writes some
module constants in set order).  Needs the project's torch and
torchvision (scripts/python-requirements.txt); no network access and no
pretrained weights.
"""

import copy
import functools
import json
import os
import sys
import time
import warnings

import torch
import torch.nn as nn
import torchvision

# The fixtures' JSON layout is that of tests/data (one writer for both).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
from make_fixtures import compact_json  # noqa: E402

# ---------------------------------------------------------------------------
# The zoo
# ---------------------------------------------------------------------------

# name -> (constructor expression, input size H = W).  The expressions are
# evaluated with `torchvision`, `nn` and `partial` in scope and are recorded
# verbatim in NAME.json.
MODELS = {
    # resnet18 is ResNet(BasicBlock, [2, 2, 2, 2]); one block per stage keeps
    # every code path (downsample branches in layers 2-4) at 44% of the size.
    "resnet18": (
        "torchvision.models.resnet.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1], "
        "num_classes=10)",
        32),
    # vit_b_16 is VisionTransformer(224, 16, 12 layers, 12 heads, 768, 3072).
    "vit_b_16": (
        "torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2, "
        "hidden_dim=64, mlp_dim=128, num_classes=10)",
        32),
    # swin_t is SwinTransformer([4, 4], 96, [2, 2, 6, 2], [3, 6, 12, 24], [7, 7],
    # stochastic_depth_prob=0.2).
    "swin_t": (
        "torchvision.models.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2, 2, 2], "
        "num_heads=[1, 2, 4, 8], window_size=[7, 7], stochastic_depth_prob=0.2, num_classes=10)",
        32),
    # convnext_tiny is ConvNeXt([(96, 192, 3), (192, 384, 3), (384, 768, 9),
    # (768, None, 3)], stochastic_depth_prob=0.1).
    "convnext_tiny": (
        "torchvision.models.ConvNeXt([torchvision.models.convnext.CNBlockConfig(16, 32, 1), "
        "torchvision.models.convnext.CNBlockConfig(32, 64, 1), "
        "torchvision.models.convnext.CNBlockConfig(64, 128, 2), "
        "torchvision.models.convnext.CNBlockConfig(128, None, 1)], "
        "stochastic_depth_prob=0.1, num_classes=10)",
        32),
    "mobilenet_v3_small": (
        "torchvision.models.mobilenet_v3_small(num_classes=10)",
        32),
    # efficientnet_b0 is _efficientnet_conf("efficientnet_b0", width_mult=1.0,
    # depth_mult=1.0) with dropout 0.2: the same stage table, halved.
    "efficientnet_b0": (
        "torchvision.models.EfficientNet(torchvision.models.efficientnet._efficientnet_conf("
        "'efficientnet_b0', width_mult=0.5, depth_mult=0.5)[0], dropout=0.2, num_classes=10)",
        32),
    # regnet_y_400mf is BlockParams.from_init_params(depth=16, w_0=48,
    # w_a=27.89, w_m=2.09, group_width=8, se_ratio=0.25), built by _regnet
    # with BatchNorm2d(eps=1e-5, momentum=0.1).
    "regnet_y_400mf": (
        "torchvision.models.RegNet(torchvision.models.regnet.BlockParams.from_init_params(depth=6, "
        "w_0=16, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25), num_classes=10, "
        "norm_layer=partial(nn.BatchNorm2d, eps=1e-05, momentum=0.1))",
        32),
    # densenet121 is DenseNet(32, (6, 12, 24, 16), 64).
    "densenet121": (
        "torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, "
        "num_classes=10)",
        32),
    "squeezenet1_0": (
        "torchvision.models.squeezenet1_0(num_classes=10)",
        32),
    "shufflenet_v2_x0_5": (
        "torchvision.models.shufflenet_v2_x0_5(num_classes=10)",
        32),
    # GoogLeNet's widths are fixed by the class; aux_logits=False drops the
    # two auxiliary heads.
    "googlenet": (
        "torchvision.models.googlenet(num_classes=10, aux_logits=False, init_weights=True)",
        32),
}

NUM_BATCHES = 3
BATCH_SIZE = 2
CHAIN_LIMIT = 20
# The overflowing layer's weight is scaled so that its largest |entry| is
# this (float32's maximum is about 3.4028e38): finite, but any product with
# an activation above ~1.13 overflows.
OVERFLOW_MAX_WEIGHT = 3e38


def build(expr):
    scope = {"torchvision": torchvision, "nn": nn, "partial": functools.partial}
    return eval(expr, scope)  # noqa: S307 - the expressions are the literals above


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def tensors_in(value):
    """Every tensor in a (nested) output: tensors, tuples, lists, dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)


def has_nonfinite(value):
    return any(not bool(torch.isfinite(t).all()) for t in tensors_in(value)
               if t.is_floating_point())


def hook_run(model, batches):
    """HF DebugUnderflowOverflow-style run: a forward hook on every module.

    Hooks fire when a module's forward returns, so a child's hook fires
    before its parent's and the root's fires last.  Returns, per batch, the
    list of (module name, output has inf/nan) in firing order.  Every module
    called at least once in a batch appears; a module called twice (ResNet's
    BasicBlock.relu) appears twice; a module never called as a module
    (MultiheadAttention.out_proj, whose weight the attention function reads
    directly) never appears.
    """
    names = {mod: name for name, mod in model.named_modules()}
    fired = []

    def hook(mod, inputs, output):
        # Check now: a later in-place op (ReLU(inplace=True)) may change it.
        fired.append((names[mod], has_nonfinite(output)))

    handles = [mod.register_forward_hook(hook) for mod in names]
    per_batch = []
    try:
        with torch.no_grad():
            for args in batches:
                fired.clear()
                model(*args)
                per_batch.append(list(fired))
    finally:
        for h in handles:
            h.remove()
    return per_batch


def hf_detection(per_batch):
    """First (batch, module) with a non-finite output, and that batch's chain."""
    for i, fired in enumerate(per_batch):
        chain = [name for name, bad in fired if bad]
        if chain:
            return {"batch": i, "module": chain[0]}, chain[:CHAIN_LIMIT]
    return None, []


def calibrate_batchnorm(model, size):
    """Give BatchNorm layers the running statistics of real activations.

    Freshly initialised BatchNorm layers hold running_mean 0, running_var 1,
    so in eval() mode they do not normalise anything and, in deep nets with
    depthwise convolutions (mobilenet, efficientnet, shufflenet), the
    activations shrink layer after layer (to ~1e-10 in mobilenet_v3_small):
    no finite weight could then make a deep layer overflow.  As after
    training, each BatchNorm gets the mean and variance of its input instead:
    one train()-mode pass over a calibration batch of 16 images
    (torch.manual_seed(3)) with momentum=None (a cumulative average, i.e.
    exactly this batch's statistics), momentum restored afterwards.  The
    learnable weights are untouched.  Returns whether there was any
    BatchNorm.
    """
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return False
    momenta = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    torch.manual_seed(3)
    x = torch.randn(16, 3, size, size, dtype=torch.float32)
    model.train()
    with torch.no_grad():
        model(x)
    for bn, momentum in zip(bns, momenta):
        bn.momentum = momentum
    model.eval()
    return True


def overflow_candidates(model, called):
    """Conv2d and Linear layers, nearest to 2/3 of named_modules() first.

    Only modules actually called as modules qualify (a module whose weight
    another module's code reads directly would not show the overflow in its
    own hook), and the last candidate (the classifier) is left out so that
    the layer is "deep inside".  Exact types: NonDynamicallyQuantizableLinear
    (MultiheadAttention.out_proj) is a Linear subclass and is not called.
    """
    names = [name for name, _ in model.named_modules()]
    position = {name: i for i, name in enumerate(names)}
    candidates = [name for name, mod in model.named_modules()
                  if type(mod) in (nn.Conv2d, nn.Linear) and name in called]
    if len(candidates) > 1:
        candidates = candidates[:-1]
    target = 2 * len(names) / 3
    return sorted(candidates, key=lambda n: (abs(position[n] - target), position[n]))


def with_overflow(model, layer):
    """A copy of `model` whose `layer` has its weight scaled to max |w| = 3e38."""
    overflow = copy.deepcopy(model)
    weight = overflow.get_submodule(layer).weight
    with torch.no_grad():
        scale = OVERFLOW_MAX_WEIGHT / float(weight.abs().max())
        weight.copy_((weight.double() * scale).float())
    assert torch.isfinite(weight).all()
    return overflow


def script_methods(scripted):
    """Methods other than forward that TorchScript compiled, per module class."""
    out = {}
    for _, mod in scripted.named_modules():
        extra = sorted(m for m in mod._c._method_names() if m != "forward")
        if extra:
            out.setdefault(mod.original_name, sorted(set(extra)))
    return dict(sorted(out.items()))


def output_kind(value):
    if isinstance(value, torch.Tensor):
        return "Tensor"
    return type(value).__name__


def first_tensor(value):
    return next(tensors_in(value))


# ---------------------------------------------------------------------------
# One model
# ---------------------------------------------------------------------------


def make_model(name, out_dir):
    expr, size = MODELS[name]
    t0 = time.time()

    torch.manual_seed(0)
    model = build(expr)
    calibrated = calibrate_batchnorm(model, size)
    model.eval()
    torch.manual_seed(1)
    batches = [(torch.randn(BATCH_SIZE, 3, size, size, dtype=torch.float32),)
               for _ in range(NUM_BATCHES)]
    assert all(torch.isfinite(b[0]).all() for b in batches)

    try:
        scripted = torch.jit.script(model)
    except Exception as e:  # torch.jit.frontend errors, RuntimeError, ...
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{name}: skipped, torch.jit.script rejects it: {type(e).__name__}: {why}")
        return None, f"{type(e).__name__}: {why}"

    # The clean model must be clean; its hook run also tells which modules
    # are called as modules.
    clean_runs = hook_run(model, batches)
    clean_detect, _ = hf_detection(clean_runs)
    clean_trips = clean_detect is not None
    assert not clean_trips, f"{name}: the clean model produces inf/nan: {clean_detect}"
    called = {n for fired in clean_runs for n, _ in fired}

    # The first candidate layer (nearest 2/3 of the way) whose scaled weight
    # makes the model overflow.  With BatchNorm calibrated that is the first
    # candidate for every model above; the others are a fallback for a layer
    # whose inputs are too small (|x| < ~1e-2) to overflow even then.
    passed_over = []
    for layer in overflow_candidates(model, called):
        overflow = with_overflow(model, layer)
        ovf_runs = hook_run(overflow, batches)
        hf_overflow, hf_chain = hf_detection(ovf_runs)
        if hf_overflow is not None:
            break
        passed_over.append(layer)
    else:
        raise AssertionError(f"{name}: no layer's scaled weight makes the model overflow")
    layer_output_nonfinite = any(bad for n, bad in ovf_runs[hf_overflow["batch"]] if n == layer)
    scripted_overflow = torch.jit.script(overflow)

    # A bad batch for the clean model: batch 1 holds one inf pixel.
    bad_image = batches[1][0].clone()
    bad_image[0, 0, 0, 0] = float("inf")
    bad_batches = [batches[0], (bad_image,), batches[2]]
    hf_bad_batch, hf_bad_chain = hf_detection(hook_run(model, bad_batches))
    assert hf_bad_batch is not None and hf_bad_batch["batch"] == 1, f"{name}: {hf_bad_batch}"

    model_file = os.path.join(out_dir, f"{name}.pt")
    overflow_file = os.path.join(out_dir, f"{name}_overflow.pt")
    inputs_file = os.path.join(out_dir, f"{name}_inputs.pt")
    bad_inputs_file = os.path.join(out_dir, f"{name}_bad_inputs.pt")
    torch.jit.save(scripted, model_file)
    torch.jit.save(scripted_overflow, overflow_file)
    torch.save(batches, inputs_file)
    torch.save(bad_batches, bad_inputs_file)

    # Load both archives back and run them on the inputs they will be used
    # with: both match eager mode (the overflow one in where it holds inf and
    # nan too; its final output may well be finite, e.g. a ReLU turns -inf
    # into 0).
    loaded = torch.jit.load(model_file)
    loaded_overflow = torch.jit.load(overflow_file)
    loaded_batches = torch.load(inputs_file)
    assert isinstance(loaded_batches, list) and len(loaded_batches) == NUM_BATCHES
    max_diff = 0.0
    with torch.no_grad():
        for args in loaded_batches:
            out_s = loaded(*args)
            out_e = model(*args)
            assert not has_nonfinite(out_s)
            max_diff = max(max_diff, float((first_tensor(out_s) - first_tensor(out_e)).abs().max()))
            out_kind = output_kind(out_s)
        ovf_s = first_tensor(loaded_overflow(*loaded_batches[0]))
        ovf_e = first_tensor(overflow(*loaded_batches[0]))
    assert torch.equal(torch.isnan(ovf_s), torch.isnan(ovf_e)), f"{name}: nan positions differ"
    assert torch.equal(torch.isinf(ovf_s), torch.isinf(ovf_e)), f"{name}: inf positions differ"
    assert max_diff < 1e-3, f"{name}: scripted and eager outputs differ by {max_diff}"
    overflow_output_nonfinite = has_nonfinite(ovf_s)

    scripted_names = [n for n, _ in loaded.named_modules()]
    eager_names = [n for n, _ in model.named_modules()]

    # Training: forward + backward on a fresh copy (train() changes BatchNorm
    # running statistics, which must not reach the saved files).
    trainable_copy = torch.jit.load(model_file)
    trainable_copy.train()
    torch.manual_seed(2)
    try:
        out = trainable_copy(*batches[0])
        if isinstance(out, torch.Tensor):
            out.sum().backward()
            trainable, train_note = True, "forward + backward in train() mode"
        else:
            trainable = False
            train_note = f"train() forward returns {output_kind(out)}, not a tensor"
    except Exception as e:
        trainable = False
        train_note = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"

    n_params = sum(p.numel() for p in model.parameters())
    info = {
        "model": name,
        "generator": "tests/zoo/make_zoo.py",
        "torch_version": torch.__version__,
        "torchvision_version": torchvision.__version__,
        "constructor": expr,
        "class": type(model).__name__,
        "num_parameters": n_params,
        "batchnorm_calibrated": calibrated,
        "files": {
            "model": os.path.basename(model_file),
            "overflow_model": os.path.basename(overflow_file),
            "inputs": os.path.basename(inputs_file),
            "bad_inputs": os.path.basename(bad_inputs_file),
        },
        "input_shape": [BATCH_SIZE, 3, size, size],
        "num_batches": NUM_BATCHES,
        "scripted_output": out_kind,
        "named_modules": eager_names,
        "scripted_named_modules_same": scripted_names == eager_names,
        "script_methods": script_methods(loaded),
        "overflow_layer": layer,
        "overflow_layer_class": type(overflow.get_submodule(layer)).__name__,
        "overflow_layers_passed_over": passed_over,
        "overflow_max_weight": OVERFLOW_MAX_WEIGHT,
        "overflow_layer_output_nonfinite": layer_output_nonfinite,
        "overflow_final_output_nonfinite": overflow_output_nonfinite,
        "hf_overflow": hf_overflow,
        "hf_chain": hf_chain,
        "hf_bad_batch": hf_bad_batch,
        "hf_bad_chain": hf_bad_chain,
        "clean_trips": clean_trips,
        "trainable": trainable,
        "trainable_note": train_note,
    }
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        f.write(compact_json(info) + "\n")

    sizes = sum(os.path.getsize(p) for p in (model_file, overflow_file, inputs_file))
    print(f"{name}: {type(model).__name__}, {n_params} params, {sizes / 1e6:.1f} MB, "
          f"overflow layer {layer}, HF: batch {hf_overflow['batch']} {hf_overflow['module']}, "
          f"trainable {str(trainable).lower()}, {time.time() - t0:.1f} s")
    return info, None


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def main():
    # TorchScript serializes some module constants in set order, which
    # depends on Python's string hash seed: re-run with a fixed seed.
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    sys.dont_write_bytecode = True
    # Scripted GoogLeNet warns on every call that it returns a namedtuple
    # (recorded as "scripted_output" in googlenet.json instead).
    warnings.filterwarnings("ignore", message="Scripted GoogleNet always returns")

    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print("usage: scripts/python.sh tests/zoo/make_zoo.py OUT_DIR [model ...]")
        print("models:", ", ".join(MODELS))
        raise SystemExit(2)
    out_dir = sys.argv[1]
    names = sys.argv[2:] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(MODELS)}")
    os.makedirs(out_dir, exist_ok=True)

    written, skipped = [], {}
    for name in names:
        info, why = make_model(name, out_dir)
        if info is None:
            skipped[name] = why
        else:
            written.append(name)

    index = {
        "generator": "tests/zoo/make_zoo.py",
        "torch_version": torch.__version__,
        "torchvision_version": torchvision.__version__,
        "models": written,
        "skipped": skipped,
    }
    with open(os.path.join(out_dir, "zoo.json"), "w") as f:
        f.write(compact_json(index) + "\n")


if __name__ == "__main__":
    main()
