"""Hugging Face's Trainer under DDP on the sentinel: two Gloo ranks on the CPU, as two processes of
this file started with torchrun's variables. Rank 1's weights overflow at step 3; the gradient
all-reduce carries the inf to rank 0. Both ranks must stop at that step's end, before the optimizer
step (never one raising inside a forward or backward while the other waits in an all-reduce), agree
that rank 1 was first, and leave no checkpoint from the poisoned step. Evaluations between steps
run on both ranks and do not disturb the ranks' rounds."""

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import traceback

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

sys.path.insert(0, os.path.dirname(__file__))
from test_trainer import Plant, arguments, gpt2, samples  # noqa: E402

BAD_RANK, BAD_STEP = 1, 3


def run_rank(rank, output_dir):
    """One rank: trains, and prints what stopped it as one JSON line."""
    from overflow_sentinel import NonFiniteError
    from overflow_sentinel.trainer import SentinelCallback

    callbacks = [SentinelCallback()]
    if rank == BAD_RANK:
        callbacks.append(Plant(BAD_STEP))
    args = arguments(output_dir, ddp_backend="gloo", max_steps=6, save_strategy="steps", save_steps=1,
                     eval_strategy="steps", eval_steps=1)
    trainer = transformers.Trainer(model=gpt2(), args=args, train_dataset=samples(24), eval_dataset=samples(4, 1),
                                   callbacks=callbacks)
    outcome = {"rank": rank}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.train()
        outcome["stopped"] = False
    except NonFiniteError as error:
        report = error.report.as_dict()
        outcome.update(stopped=True, batch=report["batch_number"], global_step=trainer.state.global_step,
                       ranks=report.get("ranks"), world_size=report.get("world_size"),
                       raised_in=[frame.name for frame in traceback.extract_tb(error.__traceback__)])
    print("OUTCOME " + json.dumps(outcome), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_under_trainer_stop_at_the_same_step_and_agree_on_the_first_rank(tmp_path):
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    ranks = [subprocess.Popen([sys.executable, __file__, str(rank), str(tmp_path)],
                              env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        outputs = [p.communicate(timeout=300) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    outcomes = []
    for rank, (p, (out, err)) in enumerate(zip(ranks, outputs)):
        assert p.returncode == 0, f"rank {rank}: {err[-3000:]}"
        line = next((line for line in out.splitlines() if line.startswith("OUTCOME ")), None)
        assert line is not None, f"rank {rank}: {out[-2000:]} {err[-2000:]}"
        outcomes.append(json.loads(line[len("OUTCOME "):]))
    for rank, o in enumerate(outcomes):
        assert o["stopped"], f"rank {rank} trained to the end"
        assert o["world_size"] == 2
        assert o["batch"] == BAD_STEP and o["global_step"] == BAD_STEP, o
        # Raised at the step's end, before the optimizer step, on both ranks.
        assert "on_pre_optimizer_step" in o["raised_in"], o["raised_in"]
        assert o["ranks"]["exchanged"] and o["ranks"]["first"]["rank"] == BAD_RANK, o["ranks"]
        assert o["ranks"]["first"]["batch_number"] == BAD_STEP
    assert outcomes[BAD_RANK]["ranks"]["role"] == "made"
    assert outcomes[1 - BAD_RANK]["ranks"]["role"] in ("received", "stopped")
    for rank in range(2):
        assert (tmp_path / f"rank{rank}" / f"sentinel_batch{BAD_STEP}.json").exists() or \
            (tmp_path / f"rank{rank}" / f"sentinel_peer_batch{BAD_STEP}.json").exists(), sorted(os.listdir(tmp_path))
    saved = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-"))
    assert saved == [f"checkpoint-{k}" for k in range(1, BAD_STEP + 1)]  # none from the poisoned step


if __name__ == "__main__":
    run_rank(int(sys.argv[1]), sys.argv[2])
