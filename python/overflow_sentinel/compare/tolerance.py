"""How far a candidate may be from the float64 reference at a module boundary, and the numbers
that say how far it is.

The tolerance is measured, not assumed: the reference is run in the candidate's precision (the
baseline) and both are compared to the reference run in float64. At a module boundary the baseline's
error is what that precision costs the reference's own code; the candidate may cost up to
`multiple` times that, never less than `floor`. docs/compare.md says why each number is what it is.
"""

import math

import torch

# One unit roundoff of each format (2^-p, p the significand's bits): the error a single rounding to
# that format makes, relative to the value. A module computed in that format cannot be expected to
# be closer than this to the exact result, whatever the baseline happened to reach.
FLOOR = {
    "float64": 2.0 ** -53,
    "float32": 2.0 ** -24,
    "float16": 2.0 ** -11,
    "bfloat16": 2.0 ** -8,
    "e4m3": 2.0 ** -4,
    "e5m2": 2.0 ** -3,
    "fp4": 2.0 ** -2,
}

# How many times the baseline's error the candidate may make. The candidate computes the same
# mathematics in another order (fused GEMMs, another layout, other kernels): its rounding errors
# are other samples of the same distribution, so the ratio of the two RMS errors scatters around 1,
# widely on small tensors. Measured on the tests' Llama port (docs/compare.md): float32 up to 2.6,
# float16 up to 1.9, bfloat16 up to 2.0. The multiples leave room above those; FP8/FP4 errors are
# dominated by the same casts of the same blocks on both sides, so their ratios stay near 1.
MULTIPLE = {
    "float64": 8.0,
    "float32": 8.0,
    "float16": 4.0,
    "bfloat16": 4.0,
    "e4m3": 2.0,
    "e5m2": 2.0,
    "fp4": 2.0,
}

# Formats whose outputs are judged by range-relative RMSE (RMSE over the reference's largest
# magnitude): a block-scaled cast's error is a share of the block's range, not of each value.
RANGE_RELATIVE = {"e4m3", "e5m2", "fp4"}

_TORCH_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}


def format_name(dtype):
    """The tolerance tables' key for a torch dtype."""
    if dtype not in _TORCH_NAMES:
        raise ValueError(f"overflow_sentinel: compare has no tolerance for dtype {dtype} "
                         f"(it knows {', '.join(sorted(FLOOR))})")
    return _TORCH_NAMES[dtype]


class Tolerance:
    """The rule for one precision: `multiple` times the baseline's error, at least `floor`."""

    def __init__(self, fmt, multiple=None, floor=None):
        if fmt not in FLOOR:
            raise ValueError(f"overflow_sentinel: compare has no tolerance for format {fmt!r} "
                             f"(it knows {', '.join(sorted(FLOOR))})")
        self.format = fmt
        self.multiple = MULTIPLE[fmt] if multiple is None else float(multiple)
        self.floor = FLOOR[fmt] if floor is None else float(floor)
        self.range_relative = fmt in RANGE_RELATIVE
        self.metric = "range-relative RMSE" if self.range_relative else "relative RMSE"

    def of(self, baseline_error):
        """The tolerance at a boundary where the baseline's error was `baseline_error`."""
        if baseline_error is None or not math.isfinite(baseline_error):
            baseline_error = 0.0
        return self.multiple * max(baseline_error, self.floor)

    def as_dict(self):
        return {"format": self.format, "multiple": self.multiple, "floor": self.floor, "metric": self.metric}


def _scale(reference, range_relative):
    """What an error is relative to: the reference's RMS, or its largest magnitude."""
    if reference.numel() == 0:
        return 1.0
    value = reference.abs().max() if range_relative else \
        torch.linalg.vector_norm(reference) / math.sqrt(reference.numel())
    value = float(value)
    return value if value > 0 else 1.0


def _float64(value, reference):
    value = value.detach().to(torch.float64)
    return value, reference.detach().to(device=value.device, dtype=torch.float64)


def error(value, reference, range_relative=False):
    """The one number a boundary is judged by: RMSE of value against the float64 reference,
    relative to the reference's RMS (or range). Both are read in float64."""
    value, reference = _float64(value, reference)
    if value.numel() == 0:
        return 0.0
    rmse = float(torch.linalg.vector_norm(value - reference)) / math.sqrt(value.numel())
    return rmse / _scale(reference, range_relative) if math.isfinite(rmse) else math.inf


def metrics(value, reference, tolerance, range_relative=False):
    """Everything the report shows of one boundary: max abs and relative error, RMSE, the judged
    error, cosine, the share of elements within `tolerance` (read as the judged error's per-element
    bound: tolerance times the reference's scale) and the element with the largest error, with
    both its values."""
    value, reference = _float64(value, reference)
    n = value.numel()
    if n == 0:
        return {"elements": 0, "error": 0.0}
    diff = (value - reference).abs_()
    rmse = float(torch.linalg.vector_norm(diff)) / math.sqrt(n)
    finite = math.isfinite(rmse)
    if not finite:
        diff = torch.nan_to_num(diff, nan=math.inf)
        rmse = math.inf
    rms = _scale(reference, False)
    scale = _scale(reference, True) if range_relative else rms
    worst = int(diff.reshape(-1).argmax())
    index = [int(i) for i in torch.unravel_index(torch.tensor(worst), value.shape)] if value.dim() else []
    # Relative error per element, with values far below the tensor's RMS read against the RMS:
    # a reference element near zero would otherwise make any error look infinite.
    max_rel = float((diff / reference.abs().clamp_min(rms * 2.0 ** -10)).max())
    if finite:
        norms = float(torch.linalg.vector_norm(value)) * rms * math.sqrt(n)
        cosine = float(torch.dot(value.reshape(-1), reference.reshape(-1))) / norms if norms else 1.0
    else:
        cosine = math.nan
    return {
        "elements": n,
        "error": rmse / scale,
        "max_abs": float(diff.reshape(-1)[worst]),
        "max_rel": max_rel,
        "rmse": rmse,
        "cosine": cosine,
        "within": int((diff <= tolerance * scale).sum()) / n,
        "worst": {"index": index,
                  "candidate": float(value.reshape(-1)[worst]),
                  "reference": float(reference.reshape(-1)[worst])},
    }
