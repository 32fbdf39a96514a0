"""overflow_sentinel._native.count_nonfinite, the watchdog's own reading pass from Python: how many
of the tensors hold inf or NaN, against torch's own isfinite; tensors it does not read (integers,
empty ones) are never counted."""

import torch

from overflow_sentinel import _native


def test_it_counts_the_tensors_torch_finds_non_finite():
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(1000, generator=g) for _ in range(6)]
    tensors[1][17] = float("inf")
    tensors[3][999] = float("nan")
    tensors[4] = tensors[4].to(torch.float16) * 1e5  # beyond float16's range: inf
    tensors[5] = tensors[5].to(torch.bfloat16)[::3]  # a strided view, finite
    expected = sum(not bool(torch.isfinite(t).all()) for t in tensors)
    assert expected == 3
    assert _native.count_nonfinite(tensors) == expected


def test_tensors_it_does_not_read_are_not_counted():
    assert _native.count_nonfinite([torch.arange(5), torch.empty(0), torch.ones(3, dtype=torch.bool)]) == 0
    assert _native.count_nonfinite([]) == 0
