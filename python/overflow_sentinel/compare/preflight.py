"""What would make the two sides differ for a reason that is not the port: dropout, randomness,
nondeterministic kernels, random ops that a compiler replaces, inputs that are not the same. Each
is set right for the compare where it can be, and named in the report either way."""

import contextlib
import os

import torch


def _dropouts(model):
    """Modules that would drop values in training mode."""
    found = []
    for path, module in model.named_modules():
        p = getattr(module, "p", None) if isinstance(module, torch.nn.modules.dropout._DropoutNd) else None
        p = p if p is not None else getattr(module, "attention_dropout", None)
        if isinstance(p, (int, float)) and p > 0 and module.training:
            found.append(path or "(root)")
    return found


def _compiled(model):
    return any(type(m).__name__ == "OptimizedModule" for m in model.modules())


@contextlib.contextmanager
def settled(reference, candidate, findings):
    """Both models in eval mode, deterministic algorithms on (warn only), Inductor's random ops
    eager-equal; everything restored on exit. Appends what it changed or found to `findings`."""
    modes = [(m, m.training) for model in (reference, candidate) for m in model.modules()]
    for side, model in (("reference", reference), ("candidate", candidate)):
        dropped = _dropouts(model)
        if dropped:
            findings.append(f"dropout: the {side} was in training mode with dropout in {len(dropped)} module(s) "
                            f"({', '.join(dropped[:4])}{', ...' if len(dropped) > 4 else ''}): set to eval() for the "
                            f"compare, where dropout would make a false difference")
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    on_gpu = any(p.is_cuda for model in (reference, candidate) for p in model.parameters())
    if on_gpu and cublas is None:
        # cuBLAS reads it when its handle is made: a process that ran a GEMM before keeps its own.
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        findings.append("determinism: CUBLAS_WORKSPACE_CONFIG was unset; set to :4096:8 for the compare (it takes "
                        "effect only where cuBLAS had not started yet: set it before the first GEMM to be sure)")
    fallback = None
    if _compiled(candidate):
        import torch._inductor.config as inductor_config
        fallback = inductor_config.fallback_random
        inductor_config.fallback_random = True
        findings.append("compile: torch._inductor.config.fallback_random set for the compare, so random ops of "
                        "regions compiled from now on draw as eager ones do (regions compiled before keep theirs)")
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        for model in (reference, candidate):
            model.eval()
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        if on_gpu and cublas is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        if fallback is not None:
            import torch._inductor.config as inductor_config
            inductor_config.fallback_random = fallback
        for module, training in modes:
            module.training = training


def check_inputs(reference_inputs, candidate_inputs, findings):
    """When the sides are given inputs of their own, those they share by name (masks, positions,
    token ids) must be equal: a different mask is a false difference."""
    if candidate_inputs is reference_inputs or not isinstance(reference_inputs, dict) \
            or not isinstance(candidate_inputs, dict):
        return
    for key in sorted(set(reference_inputs) & set(candidate_inputs)):
        a, b = reference_inputs[key], candidate_inputs[key]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape or not torch.equal(a.to(b.device), b):
                raise ValueError(f"overflow_sentinel: the reference's and the candidate's input {key!r} differ "
                                 f"({list(a.shape)} against {list(b.shape)}): identical inputs (masks, positions, "
                                 f"ids) are needed, or the compare shows a false difference")
    findings.append("inputs: the inputs both sides take by the same name are equal")
