"""Lightning's Trainer on the sentinel with one line (overflow_sentinel.lightning.SentinelCallback):
a tiny LightningModule trained on the CPU. A step is one batch numbered by Lightning's own
global_step, through gradient accumulation, validation, the sanity check and a resume; a planted
overflow stops training at its step with the report in default_root_dir and no checkpoint saved
from the poisoned weights; a huge finite gradient that Adam squares into inf is named in the
optimizer's state; a strategy the callback cannot watch is refused at setup."""

import contextlib
import io
import os
import traceback

import pytest
import torch
from torch import nn

pl = pytest.importorskip("lightning.pytorch")

from overflow_sentinel import NonFiniteError  # noqa: E402
from tiers import both_tiers  # noqa: E402
from overflow_sentinel.lightning import SentinelCallback  # noqa: E402

D = 8


class Net(pl.LightningModule):
    """Two linear layers on random batches; its training_step calls the layers, not forward
    (as many LightningModules do)."""

    def __init__(self, lr=1e-2):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, 1))
        self.lr = lr
        self.training_steps_run = 0

    def training_step(self, batch, batch_idx):
        self.training_steps_run += 1
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def data(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)


def trainer(root, callbacks, **overrides):
    base = dict(default_root_dir=str(root), accelerator="cpu", devices=1, max_steps=6, logger=False,
                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                num_sanity_val_steps=0, limit_val_batches=2, val_check_interval=None, check_val_every_n_epoch=None)
    base.update(overrides)
    return pl.Trainer(callbacks=callbacks, **base)


def quietly(fn, *args, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn(*args, **kwargs)


class Counts(pl.Callback):
    """Lightning's global_step and the watchdog's count after every training batch and every
    validation batch, with the number each training step's batch had (from the watchdog's saved
    frames, the batch numbers its ops carried)."""

    def __init__(self, sentinel):
        self.sentinel, self.at_batches, self.at_validation, self.frame_batches = sentinel, [], [], set()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        w = self.sentinel.watch
        self.at_batches.append((trainer.global_step, w.batch_number))
        self.frame_batches |= {f.batch_number for f in w.saved_frames()}

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.at_validation.append((trainer.global_step, self.sentinel.watch.batch_number))


def test_a_clean_run_with_accumulation_and_validation_counts_as_lightnings_global_step(tmp_path):
    sentinel = SentinelCallback()
    counts = Counts(sentinel)
    t = trainer(tmp_path, [sentinel, counts], accumulate_grad_batches=2, val_check_interval=4,
                num_sanity_val_steps=1)
    quietly(t.fit, Net(), data(32), data(4, 1))
    assert t.global_step == 6
    # Two micro-batches a step: after the first the step is open and the count is its number,
    # Lightning's global_step; after the second it has ended, and both have moved on by one.
    assert counts.at_batches == [((k + 1) // 2, (k + 1) // 2) for k in range(12)]
    # Validation every 2 steps (4 batches): its batches leave the count at the global step.
    assert counts.at_validation == [(0, 0), (2, 2), (2, 2), (4, 4), (4, 4), (6, 6), (6, 6)]
    assert counts.frame_batches <= set(range(6)) and 5 in counts.frame_batches
    assert sentinel.watch._native.closed  # closed at teardown: the model is left unwatched
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in t.lightning_module.modules())


class Plant(pl.Callback):
    """Makes the first layer's weight overflow the forward when Lightning's global step reaches
    `step`, at the start of its training batch or (phase="validation") of a validation."""

    def __init__(self, step, phase="training"):
        self.step, self.phase = step, phase

    def _plant(self, trainer, pl_module):
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.net[0].weight.fill_(3e38)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.phase == "training":
            self._plant(trainer, pl_module)

    def on_validation_start(self, trainer, pl_module):
        if self.phase == "validation" and not trainer.sanity_checking:
            self._plant(trainer, pl_module)

    def on_sanity_check_start(self, trainer, pl_module):
        if self.phase == "sanity check":
            self._plant(trainer, pl_module)


def saved_checkpoints(root):
    return sorted(p.name for p in root.rglob("*.ckpt"))


def test_a_planted_overflow_stops_at_its_step_with_the_report_on_disk_and_no_checkpoint_after(tmp_path):
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    module = Net()
    t = trainer(tmp_path, [SentinelCallback(), Plant(3), checkpoints], enable_checkpointing=True)
    with pytest.raises(NonFiniteError) as caught:
        quietly(t.fit, module, data(32))
    report = caught.value.report
    assert report.batch_number == 3 == t.global_step and report.phase is None
    assert report.trigger.module_path == "net.0"
    # Raised before the optimizer wrote with it: from the hook before the optimizer step, and
    # Adam stepped three times only.
    raised_in = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert "on_before_optimizer_step" in raised_in and "training_step" not in raised_in, raised_in
    assert all(s["step"] == 3 for s in t.optimizers[0].state.values())
    assert (tmp_path / "sentinel_batch3.txt").exists() and (tmp_path / "sentinel_batch3.json").exists()
    # Checkpoints after steps 1 to 3 (Lightning names them by the global step after it), none after.
    assert saved_checkpoints(tmp_path) == [f"epoch=0-step={k}.ckpt" for k in (1, 2, 3)]


@pytest.mark.parametrize("phase", ["validation", "sanity check"])
def test_an_overflow_met_by_validation_or_the_sanity_check_says_so_numbered_by_the_step_it_follows(tmp_path, phase):
    step = 2 if phase == "validation" else 0
    t = trainer(tmp_path, [SentinelCallback(), Plant(step, phase)], val_check_interval=2, num_sanity_val_steps=1)
    with pytest.raises(NonFiniteError) as caught:
        quietly(t.fit, Net(), data(32), data(4, 1))
    report = caught.value.report
    assert report.phase == phase and report.batch_number == step == t.global_step
    text = (tmp_path / f"sentinel_batch{step}.txt").read_text()
    assert f"Detected inf/nan during batch_number={step} ({phase})" in text


class HugeGradient(pl.Callback):
    """At global step `step`, elements of the first layer's weight gradient become `value`: 1e22
    is finite, but its square times Adam's 1 - beta2 overflows float32; two of 3e38 make a norm
    beyond float32's range."""

    def __init__(self, step, value=1e22, elements=((1, 2),)):
        self.step, self.value, self.elements = step, value, elements

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step == self.step:
            with torch.no_grad():
                for element in self.elements:
                    pl_module.net[0].weight.grad[element] = self.value


def test_an_optimizer_state_made_inf_by_a_huge_finite_gradient_is_named_with_its_element(tmp_path):
    module = Net()
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    t = trainer(tmp_path, [checkpoints, SentinelCallback(), HugeGradient(2)], enable_checkpointing=True)
    with pytest.raises(NonFiniteError) as caught:
        quietly(t.fit, module, data(32))
    report = caught.value.report
    assert report.batch_number == 2
    # Raised at the step's end, before the checkpoint callback (listed first, run last) saved it.
    assert saved_checkpoints(tmp_path) == ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt"]
    assert report.first_nonfinite["tensor"] == "net.0.weight.exp_avg_sq"
    assert report.first_nonfinite["index"] == (1, 2) and report.first_nonfinite["value"] == float("inf")
    assert "net.0.weight.exp_avg_sq[1, 2] = inf" in str(caught.value)
    # The oracle: the state as torch's Adam left it.
    state = t.optimizers[0].state[module.net[0].weight]
    assert torch.isinf(state["exp_avg_sq"][1, 2]) and torch.isfinite(state["exp_avg_sq"]).sum() == 16 * D - 1
    raised_in = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert "on_train_batch_end" in raised_in, raised_in


@both_tiers
def test_with_clipping_a_non_finite_gradient_norm_is_named_at_the_steps_end(tmp_path, tier):
    # Lightning clips after on_before_optimizer_step, inside the optimizer's closure: the norm of
    # two gradients of 3e38 is beyond float32 (the oracle: torch's own norm of them), and the step
    # is lost (clipping multiplies every gradient by 1 / inf).
    assert torch.linalg.vector_norm(torch.tensor([3e38, 3e38])).isinf()
    t = trainer(tmp_path, [SentinelCallback(), HugeGradient(2, 3e38, ((1, 2), (1, 3)))], gradient_clip_val=1.0)
    with pytest.raises(NonFiniteError) as caught:
        quietly(t.fit, Net(), data(32))
    assert caught.value.report.batch_number == 2 and caught.value.report.gradient_norm_nonfinite
    assert "gradient norm at clipping is non-finite" in str(caught.value)


def test_a_resumed_run_goes_on_numbering_from_its_checkpoints_step(tmp_path):
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    quietly(trainer(tmp_path, [SentinelCallback(), checkpoints], max_steps=4, enable_checkpointing=True).fit,
            Net(), data(32))
    resumed = SentinelCallback()
    counts = Counts(resumed)
    t = trainer(tmp_path, [resumed, counts], max_steps=5)
    quietly(t.fit, Net(), data(32), ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=2.ckpt"))
    assert counts.at_batches == [(3, 3), (4, 4), (5, 5)]
    assert counts.frame_batches <= {2, 3, 4} and 2 in counts.frame_batches


def test_the_watched_run_trains_as_the_unwatched_one(tmp_path):
    unwatched, watched = Net(), Net()
    quietly(trainer(tmp_path, []).fit, unwatched, data(32))
    quietly(trainer(tmp_path, [SentinelCallback()]).fit, watched, data(32))
    assert all(torch.equal(a, b) for a, b in zip(unwatched.parameters(), watched.parameters()))


class CallsItself(Net):
    """Its training_step calls the LightningModule itself (`self(x)`), as DDP's wrapper does."""

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)


class GradientChecks(pl.Callback):
    """Counts the watchdog's checks of the gradients, one list entry per backward."""

    def __init__(self, sentinel):
        self.sentinel, self.per_backward = sentinel, []

    def on_fit_start(self, trainer, pl_module):
        w = self.sentinel.watch
        after_backward = w._after_backward

        def counted():
            self.per_backward[-1] += 1
            after_backward()

        w._after_backward = counted

    def on_before_backward(self, trainer, pl_module, loss):
        self.per_backward.append(0)


@pytest.mark.parametrize("module", [Net, CallsItself])
def test_the_gradients_are_checked_once_a_backward_whether_or_not_the_step_calls_the_module_itself(tmp_path, module):
    sentinel = SentinelCallback()
    checks = GradientChecks(sentinel)
    quietly(trainer(tmp_path, [sentinel, checks], accumulate_grad_batches=2, max_steps=2).fit, module(), data(32))
    assert checks.per_backward == [1, 1, 1, 1]


class Predicting(Net):
    def forward(self, x):
        return self.net(x)

    def test_step(self, batch, batch_idx):
        return self.validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_validate_test_and_predict_are_watched_and_labelled(tmp_path, stage):
    sentinel = SentinelCallback()
    module = Predicting()
    quietly(getattr(trainer(tmp_path, [sentinel]), stage), module, data(4, 1))
    assert sentinel.watch._native.closed  # watched, then closed at teardown
    with torch.no_grad():
        module.net[0].weight.fill_(3e38)
    with pytest.raises(NonFiniteError) as caught:
        quietly(getattr(trainer(tmp_path, [SentinelCallback()]), stage), module, data(4, 1))
    assert caught.value.report.phase == {"validate": "validation", "test": "test", "predict": "prediction"}[stage]
    assert caught.value.report.batch_number == 0


class DataParallelStrategy(pl.strategies.ParallelStrategy):
    """As Lightning 1.x's "dp": the module replicated by DataParallel at each forward."""

    @property
    def root_device(self):
        return torch.device("cpu")

    def model_to_device(self):
        pass

    def setup(self, trainer):
        super().setup(trainer)
        self.model = torch.nn.DataParallel(self.model)

    def reduce(self, tensor, *args, **kwargs):
        return tensor

    def barrier(self, *args, **kwargs):
        pass

    def broadcast(self, obj, src=0):
        return obj


class WrappingStrategy(pl.strategies.SingleDeviceStrategy):
    """One device, whose model is wrapped in DataParallel when fitting starts."""

    def setup(self, trainer):
        super().setup(trainer)
        self.model = torch.nn.DataParallel(self.model)


def test_bad_input_unknown_options_and_a_strategy_it_cannot_watch_get_clear_errors(tmp_path):
    with pytest.raises(TypeError, match="max_frame_to_save, no_such_option"):
        SentinelCallback(no_such_option=1, max_frame_to_save=3)
    module = Net()
    t = trainer(tmp_path, [SentinelCallback()], strategy=DataParallelStrategy())
    with pytest.raises(ValueError, match="DataParallelStrategy is not a strategy it watches") as caught:
        quietly(t.fit, module, data(8))
    assert "setup" in [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert module.training_steps_run == 0
    module = Net()
    t = trainer(tmp_path, [SentinelCallback()], strategy=WrappingStrategy("cpu"))
    with pytest.raises(ValueError, match="replicated by DataParallel"):
        quietly(t.fit, module, data(8))
    assert module.training_steps_run == 0
