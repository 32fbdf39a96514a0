"""Hugging Face's Trainer on the sentinel with one line (overflow_sentinel.trainer.SentinelCallback):
a small GPT-2 from a config (random weights, no hub), trained with debug="underflow_overflow". A
step is one batch numbered by the global step, through gradient accumulation, evaluations and a
resume; a planted overflow stops training at its step's end, with the report in output_dir and no
checkpoint saved from the poisoned weights; an evaluation between steps that finds one says so."""

import contextlib
import io
import json
import os
import traceback
import types

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from overflow_sentinel import NonFiniteError  # noqa: E402
from tiers import both_tiers  # noqa: E402
from overflow_sentinel.trainer import SentinelCallback  # noqa: E402


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=100,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def samples(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 100, (n, 8), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def arguments(output_dir, **overrides):
    base = dict(output_dir=str(output_dir), per_device_train_batch_size=2, per_device_eval_batch_size=2,
                max_steps=6, learning_rate=1e-3, save_strategy="no", logging_strategy="no", report_to="none",
                use_cpu=True, disable_tqdm=True, seed=0, debug="underflow_overflow")
    base.update(overrides)
    return transformers.TrainingArguments(**base)


class Plant(transformers.TrainerCallback):
    """Makes a weight overflow when the global step reaches `step` (at its start, or at the end
    of the step before with `after_step`: then the evaluation after that step meets it first)."""

    def __init__(self, step, after_step=False):
        self.step, self.after_step = step, after_step

    def _plant(self, state, model):
        if state.global_step == self.step:
            with torch.no_grad():
                model.transformer.h[1].mlp.c_fc.weight.fill_(3e38)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if not self.after_step:
            self._plant(state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.after_step:
            self._plant(state, model)


class Counts(transformers.TrainerCallback):
    """The watchdog's batch number seen at each step's end and at each evaluation's end."""

    def __init__(self, sentinel):
        self.sentinel, self.at_steps, self.at_evaluations = sentinel, [], []

    def on_step_end(self, args, state, control, **kwargs):
        self.at_steps.append((state.global_step, self.sentinel.watch.batch_number))

    def on_evaluate(self, args, state, control, **kwargs):
        self.at_evaluations.append((state.global_step, self.sentinel.watch.batch_number))


def test_a_planted_overflow_stops_training_at_its_step_with_the_report_in_output_dir_and_no_checkpoint_after(tmp_path):
    sentinel = SentinelCallback()
    trainer = transformers.Trainer(model=gpt2(), args=arguments(tmp_path, save_strategy="steps", save_steps=1),
                                   train_dataset=samples(12), callbacks=[sentinel, Plant(3)])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(NonFiniteError) as caught:
        trainer.train()
    report = caught.value.report
    assert report.batch_number == 3 and report.phase is None
    # Raised at the step's end, before the optimizer step: not inside the forward that met it.
    raised_in = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert "on_pre_optimizer_step" in raised_in and "training_step" not in raised_in, raised_in
    assert report.trigger.module_path.startswith("transformer.h.1.mlp")
    assert (tmp_path / "sentinel_batch3.txt").exists() and (tmp_path / "sentinel_batch3.json").exists()
    saved = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-"))
    assert saved == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]  # none from the poisoned step
    assert trainer.state.global_step == 3
    # HF's own class, which Trainer built for debug="underflow_overflow", has no hook left.
    from transformers.debug_utils import DebugUnderflowOverflow as HfDebugUnderflowOverflow

    assert not [hook for module in trainer.model.modules() for hook in module._forward_hooks.values()
                if isinstance(getattr(hook, "__self__", None), HfDebugUnderflowOverflow)]


def test_accumulated_micro_batches_are_one_batch_an_evaluation_does_not_move_the_count_and_a_resume_goes_on(tmp_path):
    sentinel = SentinelCallback()
    counts = Counts(sentinel)
    args = arguments(tmp_path, gradient_accumulation_steps=4, max_steps=3, eval_strategy="steps", eval_steps=1,
                     save_strategy="steps", save_steps=2)
    trainer = transformers.Trainer(model=gpt2(), args=args, train_dataset=samples(24), eval_dataset=samples(4, 1),
                                   callbacks=[sentinel, counts])
    trainer.train()
    # After step k (global_step k) the next batch is k: one batch per step of 4 micro-batches, and
    # the evaluations (two forwards each) after every step leave the count where it was.
    assert counts.at_steps == [(1, 1), (2, 2), (3, 3)]
    assert [step for step, _ in counts.at_evaluations] == [1, 2, 3]
    resumed = SentinelCallback()
    counts = Counts(resumed)
    trainer = transformers.Trainer(model=gpt2(), args=arguments(tmp_path, gradient_accumulation_steps=4, max_steps=4),
                                   train_dataset=samples(24), callbacks=[resumed, counts])
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert counts.at_steps == [(3, 3), (4, 4)]


def test_an_overflow_first_met_by_an_evaluation_between_steps_says_so(tmp_path):
    sentinel = SentinelCallback()
    args = arguments(tmp_path, eval_strategy="steps", eval_steps=1)
    trainer = transformers.Trainer(model=gpt2(), args=args, train_dataset=samples(12), eval_dataset=samples(4, 1),
                                   callbacks=[sentinel, Plant(2, after_step=True)])
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(NonFiniteError) as caught:
        trainer.train()
    assert caught.value.report.phase == "evaluation"
    assert caught.value.report.batch_number == 2 and "evaluation" in str(caught.value)
    # The report's files say so too.
    assert json.loads((tmp_path / "sentinel_batch2.json").read_text())["phase"] == "evaluation"
    assert "Detected inf/nan during batch_number=2 (evaluation)" in (tmp_path / "sentinel_batch2.txt").read_text()


class PlantGradient(transformers.TrainerCallback):
    """At step `step`, one element of a weight's gradient becomes 1e20: finite, but its square
    overflows float32, so the total norm that clipping computes is inf."""

    def __init__(self, step):
        self.step = step

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            def huge(grad):
                grad = grad.clone()
                grad[0, 0] = 1e20
                return grad

            model.transformer.h[1].mlp.c_fc.weight.register_hook(huge)


@both_tiers
def test_with_clipping_on_a_non_finite_gradient_norm_is_named_and_the_optimizer_never_steps_with_it(tmp_path, tier):
    sentinel = SentinelCallback()
    model = gpt2()
    trainer = transformers.Trainer(model=model, args=arguments(tmp_path, max_grad_norm=1.0), train_dataset=samples(12),
                                   callbacks=[sentinel, PlantGradient(2)])
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(NonFiniteError) as caught:
        trainer.train()
    report = caught.value.report
    assert report.batch_number == 2 and report.gradient_norm_nonfinite
    assert "gradient norm at clipping is non-finite" in str(caught.value)
    assert trainer.optimizer.state[model.transformer.h[1].mlp.c_fc.weight]["step"] == 2  # step 2 never ran
    assert all(torch.isfinite(p).all() for p in model.parameters())


@both_tiers
def test_with_clipping_off_training_runs_on_and_a_huge_gradient_still_stops_at_the_norm(tmp_path, tier):
    # Trainer then computes the norm for its logs as clip_grad_norm_(parameters, inf): inf / norm,
    # clamped to 1, multiplies every gradient. Trainer's default optimizer is the fused AdamW.
    model = gpt2()
    trainer = transformers.Trainer(model=model, args=arguments(tmp_path, max_grad_norm=0.0, max_steps=3),
                                   train_dataset=samples(12), callbacks=[SentinelCallback()])
    assert trainer.args.optim == transformers.training_args.OptimizerNames.ADAMW_TORCH_FUSED
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    assert trainer.state.global_step == 3
    planted = transformers.Trainer(model=gpt2(), args=arguments(tmp_path / "planted", max_grad_norm=0.0),
                                   train_dataset=samples(12), callbacks=[SentinelCallback(), PlantGradient(2)])
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(NonFiniteError) as caught:
        planted.train()
    assert caught.value.report.batch_number == 2 and caught.value.report.gradient_norm_nonfinite


def test_bad_input_options_that_do_not_exist_and_dataparallel_get_clear_errors():
    with pytest.raises(TypeError, match="max_frame_to_save, no_such_option"):
        SentinelCallback(no_such_option=1, max_frame_to_save=3)
    args = types.SimpleNamespace(n_gpu=2, parallel_mode=transformers.training_args.ParallelMode.NOT_DISTRIBUTED)
    with pytest.raises(ValueError, match="DataParallel"):
        SentinelCallback().on_train_begin(args, None, None, model=gpt2())
