"""Lightning's Trainer under DDP (strategy="ddp") on the sentinel: two Gloo ranks on the CPU under
the venv's torchrun. Rank 1's weights overflow at step 3; the gradient all-reduce carries the inf
to rank 0. Both ranks must stop at that step, before the optimizer step (never one raising inside
a forward or backward while the other waits in the all-reduce), agree that rank 1 was first, and
leave no checkpoint from the poisoned step. Validation after every step runs on both ranks, as
batches of their own that do not disturb the ranks' rounds."""

import json
import os
import socket
import subprocess
import sys
import traceback

import pytest

pytest.importorskip("lightning.pytorch")

sys.path.insert(0, os.path.dirname(__file__))

BAD_RANK, BAD_STEP = 1, 3


def run_rank(root):
    """One rank (started by torchrun): trains, and writes what stopped it to outcome<rank>.json."""
    import lightning.pytorch as pl

    from overflow_sentinel import NonFiniteError
    from overflow_sentinel.lightning import SentinelCallback
    from test_lightning import Net, Plant, data, quietly, trainer

    rank = int(os.environ["RANK"])
    callbacks = [SentinelCallback(), pl.callbacks.ModelCheckpoint(dirpath=os.path.join(root, "ckpt"),
                                                                  every_n_train_steps=1, save_top_k=-1)]
    if rank == BAD_RANK:
        callbacks.insert(1, Plant(BAD_STEP))
    t = trainer(root, callbacks, strategy="ddp", devices=2, val_check_interval=1, enable_checkpointing=True)
    outcome = {"rank": rank}
    try:
        quietly(t.fit, Net(), data(32), data(8, 1))
        outcome["stopped"] = False
    except NonFiniteError as error:
        report = error.report.as_dict()
        outcome.update(stopped=True, batch=report["batch_number"], global_step=t.global_step,
                       ranks=report.get("ranks"), world_size=report.get("world_size"),
                       raised_in=[frame.name for frame in traceback.extract_tb(error.__traceback__)],
                       trigger=str(error.report.trigger), origin=error.report.origin)
    # A file per rank: torchrun interleaves the ranks' standard outputs.
    with open(os.path.join(root, f"outcome{rank}.json"), "w") as f:
        json.dump(outcome, f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_under_lightning_ddp_stop_at_the_same_step_and_agree_on_the_first_rank(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", __file__, str(tmp_path)]
    p = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        pytest.fail(f"the ranks hung past 240 s: {out[-2000:]} {err[-3000:]}")
    assert p.returncode == 0, f"{out[-2000:]} {err[-4000:]}"
    files = [tmp_path / f"outcome{rank}.json" for rank in range(2)]
    assert all(f.exists() for f in files), f"{out[-2000:]} {err[-3000:]}"
    outcomes = [json.loads(f.read_text()) for f in files]
    for rank, o in enumerate(outcomes):
        assert o["stopped"], f"rank {rank} trained to the end"
        assert o["world_size"] == 2
        assert o["batch"] == BAD_STEP and o["global_step"] == BAD_STEP, o
        # Raised before the optimizer step, on both ranks.
        assert "on_before_optimizer_step" in o["raised_in"], o["raised_in"]
        assert o["ranks"]["exchanged"] and o["ranks"]["first"]["rank"] == BAD_RANK, o["ranks"]
        assert o["ranks"]["first"]["batch_number"] == BAD_STEP
    assert outcomes[BAD_RANK]["ranks"]["role"] == "made"
    assert outcomes[1 - BAD_RANK]["ranks"]["role"] in ("received", "stopped"), outcomes[1 - BAD_RANK]
    for rank in range(2):
        assert (tmp_path / f"rank{rank}" / f"sentinel_batch{BAD_STEP}.json").exists() or \
            (tmp_path / f"rank{rank}" / f"sentinel_peer_batch{BAD_STEP}.json").exists(), sorted(os.listdir(tmp_path))
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert saved == [f"epoch=0-step={k}.ckpt" for k in range(1, BAD_STEP + 1)]  # none from the poisoned step


if __name__ == "__main__":
    run_rank(sys.argv[1])
