"""FSDP2 (`fully_shard`, per block and at the root) trained watched on Gloo ranks on the CPU, under
the venv's torchrun: a clean run's losses and parameters are bit-equal to an unwatched run's in the
same process (the all-gather's buffer, uninitialized memory, is never judged); an overflow planted
in one rank's input, or in a parameter's shard, stops every rank at that step under a hard timeout
(the reduce-scatter runs inside the backward: nothing is raised before the optimizer step), every
report naming the first rank and the op; an overflow in FSDP's own casts to param_dtype and
reduce_dtype names what was cast and the module's MixedPrecisionPolicy."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from torch import nn

D, STEPS = 16, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D, 2 * D)
        self.fc2 = nn.Linear(2 * D, D)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(D, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def sharded(param_dtype=None, reduce_dtype=None):
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = Net()
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    assert isinstance(model, FSDPModule) and isinstance(model.blocks[0], FSDPModule)
    return model


def batch(step, rank, plant):
    torch.manual_seed(1000 + 10 * step + rank)
    x = torch.randn(8, D)
    if plant == f"input:{rank}:{step}":
        x[2, 3] = float("inf")  # on this rank only
    return x


def train(model, plant="", watch=False, report_dir=None, exact=True):
    import overflow_sentinel

    rank = torch.distributed.get_rank()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    w = None
    if watch:
        w = overflow_sentinel.watch_steps(model, optimizer, report_dir=report_dir, max_frames_to_save=400,
                                          exact=exact)
    losses = []
    for step in range(STEPS):
        kind, plant_rank, plant_step = (plant.split(":") + ["", "-1", "-1"])[:3]
        if kind == "grad" and int(plant_rank) == rank and int(plant_step) == step:
            count_float16_overflow(model.blocks[1])
        if kind in ("shard", "cast") and int(plant_rank) == rank and int(plant_step) == step:
            with torch.no_grad():  # this rank's shard only: inf, or beyond float16's range
                model.blocks[1].fc2.weight._local_tensor[0, 0] = float("inf") if kind == "shard" else 1e5
        loss = model(batch(step, rank, plant)).square().mean()
        if kind == "grad" and int(plant_rank) == rank and int(plant_step) == step:
            loss = loss * 1e7  # this rank's gradients: finite in float32, beyond float16's range
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, w


# What torch's own cast to float16 makes inf of the gradients FSDP reduces for one module.
OVERFLOWED = []


def count_float16_overflow(module):
    for param in module._get_fsdp_state()._fsdp_param_group.fsdp_params:
        param._unsharded_param.register_post_accumulate_grad_hook(
            lambda p: OVERFLOWED.append(int(torch.isinf(p.grad.to(torch.float16)).sum())))


def run_rank(mode, report_dir):
    import torch.distributed as dist

    # Memory from `empty` (the all-gather's and reduce-scatter's buffers) then holds NaN: a run
    # cannot pass by reading a zeroed page.
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    outcome = {"rank": rank}
    # "boundary/...": the same run watched at module boundaries (exact=False).
    exact = not mode.startswith("boundary/")
    mode = mode.split("/")[-1]
    if mode == "clean":
        unwatched = sharded()
        expected, _ = train(unwatched)
        model = sharded()
        losses, w = train(model, watch=True, report_dir=report_dir, exact=exact)
        outcome["equal_losses"] = losses == expected
        outcome["equal_parameters"] = all(torch.equal(a._local_tensor, b._local_tensor)
                                          for a, b in zip(unwatched.parameters(), model.parameters()))
        outcome["report"] = w.report is not None
        outcome["batch_number"] = w.batch_number
        outcome["tolerated"] = w.tolerated()
        frames = w.saved_frames()
        outcome["classes"] = sorted({f.module_class for f in frames if f.module_class})
        outcome["labels"] = sorted({e.label for f in frames for e in f.entries})
        w.close()
    else:
        from overflow_sentinel import NonFiniteError

        if mode.startswith("grad"):  # gradients reduced in float16
            model = sharded(reduce_dtype=torch.float16)
        else:
            model = sharded(torch.float16 if mode.startswith("cast") else None)
        try:
            train(model, plant=mode, watch=True, report_dir=report_dir, exact=exact)
            outcome["stopped"] = False
        except NonFiniteError as error:
            report = error.report
            data = report.as_dict()
            outcome.update(stopped=True, batch=report.batch_number, ranks=data.get("ranks"),
                           trigger=str(report.trigger), origin=report.origin,
                           mixed_precision=report.mixed_precision, overflowed=sum(OVERFLOWED),
                           replay_notes=error.replay.notes if getattr(error, "replay", None) else None)
    # A file per rank: torchrun interleaves the ranks' standard outputs.
    with open(os.path.join(report_dir, f"outcome{rank}.json"), "w") as f:
        json.dump(outcome, f)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode, ranks, tmp_path, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__, mode, str(tmp_path)]
    p = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        pytest.fail(f"{mode} on {ranks} ranks hung past {timeout} s: {out[-2000:]} {err[-3000:]}")
    assert p.returncode == 0, f"{mode}: {out[-2000:]} {err[-4000:]}"
    files = [tmp_path / f"outcome{rank}.json" for rank in range(ranks)]
    assert all(f.exists() for f in files), f"{out[-2000:]} {err[-3000:]}"
    return [json.loads(f.read_text()) for f in files]


def test_a_clean_fsdp2_run_trains_watched_bit_equal_to_an_unwatched_one(tmp_path):
    for o in launch("clean", 2, tmp_path):
        assert o["equal_losses"] and o["equal_parameters"], o
        assert not o["report"] and o["batch_number"] == STEPS
        assert o["tolerated"] == []
        # The user's classes, not fully_shard's FSDP<Class>; the unsharded weights by full name.
        assert "Block" in o["classes"] and not any(c.startswith("FSDP") for c in o["classes"]), o["classes"]
        assert "blocks.0.fc1.weight" in o["labels"], o["labels"]
        # AdamW's state of a shard, as the optimizer's ops on DTensors read it: this rank's rows.
        rows = "[0:16]" if o["rank"] == 0 else "[16:32]"
        assert f"blocks.0.fc1.weight.exp_avg{rows}" in o["labels"], o["labels"]
        # The gradient's shard as the optimizer reads it; the unsharded one as FSDP reduces it.
        assert f"blocks.0.fc1.weight.grad{rows}" in o["labels"], o["labels"]
        assert "blocks.0.fc1.weight.grad" in o["labels"], o["labels"]


def test_watched_at_module_boundaries_fsdp2_trains_bit_equal_and_a_shards_inf_stops_every_rank_unreplayed(tmp_path):
    clean = tmp_path / "clean"
    clean.mkdir()
    for o in launch("boundary/clean", 2, clean):
        assert o["equal_losses"] and o["equal_parameters"] and not o["report"] and o["batch_number"] == STEPS, o
        assert "Block" in o["classes"] and "weight" in o["labels"], o
    # The inf all-gathered into every rank's blocks.1.fc2: each stops at that module's frame; a
    # replay would gather the shards again on one rank alone (a hang): none runs, and it says why.
    for o in launch("boundary/shard:0:1", 2, tmp_path):
        assert o["stopped"] and o["batch"] == 1, o
        assert o["trigger"].startswith("blocks.1.fc2 Linear forward"), o["trigger"]
        assert o["replay_notes"] and "sharded by FSDP2" in o["replay_notes"][0], o


@pytest.mark.parametrize("ranks", [2, 4])
def test_an_overflow_in_one_ranks_input_stops_every_rank_at_that_step_naming_it(tmp_path, ranks):
    bad = ranks - 1
    for o in launch(f"input:{bad}:2", ranks, tmp_path):
        assert o["stopped"] and o["batch"] == 2, o
        assert o["ranks"]["first"]["rank"] == bad and o["ranks"]["first"]["batch_number"] == 2, o["ranks"]
        if o["rank"] == bad:
            assert o["ranks"]["role"] == "made"
            assert o["trigger"] == "blocks.0.fc1 Linear aten::linear", o["trigger"]
            assert "passed through aten::linear in blocks.0.fc1 (Linear) - it was already in input[0]" in o["origin"]


def test_an_inf_in_a_parameter_shard_stops_every_rank_naming_the_parameter(tmp_path):
    for o in launch("shard:0:1", 2, tmp_path):
        assert o["stopped"] and o["batch"] == 1, o
        assert o["ranks"]["first"]["batch_number"] == 1, o["ranks"]
        # FSDP's all-gather is the first to read the shard: labelled with its scope, and the
        # report names the parameter and this rank's rows of it.
        if o["rank"] == 0:
            assert "FSDP::all_gather" in o["trigger"], o["trigger"]
            assert "blocks.1.fc2.weight[0:8]" in o["origin"], o["origin"]


def test_an_overflow_in_fsdps_param_dtype_cast_names_the_parameter_and_the_dtypes(tmp_path):
    for o in launch("cast:0:1", 2, tmp_path):
        assert o["stopped"] and o["batch"] == 1, o
        if o["rank"] == 0:
            # MixedPrecisionPolicy(param_dtype=float16) casts the shard before the all-gather.
            assert "FSDP::all_gather" in o["trigger"] or "FSDP::all_gather" in o["origin"], o
            assert "a conversion of blocks.1.fc2.weight[0:8] float32 → float16: 1 value above 65504" in o["origin"], o
        else:  # it reached rank 1 through the all-gather
            assert o["ranks"]["role"] == "received", o["ranks"]
            assert "it arrived through a collective" in o["origin"], o["origin"]
        assert o["ranks"]["first"]["rank"] == 0, o["ranks"]
        assert o["mixed_precision"] == {"module": "blocks.1", "param_dtype": "float16", "reduce_dtype": None}, o
        assert "MixedPrecisionPolicy of blocks.1 (Block): param_dtype=float16, reduce_dtype=None" in o["origin"], o


def test_an_overflow_in_fsdps_reduce_dtype_cast_names_the_gradients_and_the_policy(tmp_path):
    # Rank 1's gradients of blocks.1 are finite in float32 and beyond float16's range, which
    # MixedPrecisionPolicy(reduce_dtype=float16) casts them to before the reduce-scatter inside the
    # backward: rank 1 made the inf, rank 0 received it through the reduce-scatter.
    for o in launch("grad:1:2", 2, tmp_path):
        assert o["stopped"] and o["batch"] == 2, o
        assert o["ranks"]["first"]["rank"] == 1, o["ranks"]
        assert "FSDP::post_backward" in o["trigger"], o["trigger"]
        assert o["mixed_precision"] == {"module": "blocks.1", "param_dtype": None, "reduce_dtype": "float16"}, o
        if o["rank"] == 1:
            assert o["ranks"]["role"] == "made"
            grads = ", ".join(f"blocks.1.{p}.grad" for p in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"))
            assert o["overflowed"] > 0
            assert (f"a conversion of {grads} float32 → float16: {o['overflowed']} values above 65504"
                    in o["origin"]), o["origin"]
        else:
            assert o["ranks"]["role"] == "received", o["ranks"]


if __name__ == "__main__":
    run_rank(sys.argv[1], sys.argv[2])
