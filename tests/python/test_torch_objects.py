"""Objects that torch binds with pybind11, made in Python, passed into the native module: they
arrive as the C++ objects torch made (the module is built with torch's own pybind11 and the same
compiler ABI, docs/platform.md). A module built otherwise fails these with a TypeError.

Two ranks run as two processes of this file, exchanging through the c10d object given."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import overflow_sentinel

from models import Mlp

BAD_RANK, BAD_BATCH = 1, 1


def run_rank(rank, store_path):
    """One rank: three batches; the bad rank's second batch overflows in fc1. Prints the report's
    line that names the first rank to see an inf/nan."""
    ranks = {"store": dist.FileStore(store_path, 2), "rank": rank, "world_size": 2}
    torch.manual_seed(0)
    model = Mlp()
    try:
        with overflow_sentinel.watch(model, ranks=ranks) as w:
            for batch in range(3):
                if (rank, batch) == (BAD_RANK, BAD_BATCH):
                    with torch.no_grad():
                        model.fc1.weight.fill_(1e30)  # times the input's 1e10: inf in fc1
                model(torch.full((2, 16), 1e10))
                w.check()
        print("no stop")
    except overflow_sentinel.NonFiniteError as e:
        print(next(line for line in e.text.splitlines() if "First to see inf/nan" in line))


def test_a_process_group_made_in_python_is_taken_as_the_channel():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = Mlp()
        with torch.no_grad():
            model.fc1.weight.fill_(1e30)
        with overflow_sentinel.watch(model, ranks={"group": dist.group.WORLD}) as w:
            with pytest.raises(overflow_sentinel.NonFiniteError):
                model(torch.full((2, 16), 1e10))
                w.check()
    finally:
        dist.destroy_process_group()


def test_two_ranks_agree_through_a_store_made_in_python(tmp_path):
    store_path = str(tmp_path / "store")
    ranks = [subprocess.Popen([sys.executable, __file__, str(rank), store_path], env=os.environ.copy(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outputs = [p.communicate(timeout=120) for p in ranks]
    for rank, (p, (out, err)) in enumerate(zip(ranks, outputs)):
        assert p.returncode == 0, f"rank {rank}: {err[-2000:]}"
        assert f"First to see inf/nan: rank {BAD_RANK}" in out, f"rank {rank}: {out}"
        assert f"batch {BAD_BATCH}" in out, f"rank {rank}: {out}"


@pytest.mark.parametrize("key, wanted", [("store", "a torch.distributed Store"),
                                         ("group", "a torch.distributed ProcessGroup")])
def test_something_else_than_a_c10d_object_is_a_type_error_naming_it(key, wanted):
    with pytest.raises(TypeError, match=f"ranks.*{key}.*must be {wanted}, not dict"):
        overflow_sentinel.Watch(Mlp(), ranks={key: {}})


if __name__ == "__main__":
    run_rank(int(sys.argv[1]), sys.argv[2])
