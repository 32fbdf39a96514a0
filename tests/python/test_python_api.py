"""The Python module's own surface: options by keyword, bad input, what removing a watchdog leaves,
memory over many batches, FP8 metrics against the native CLI, compiled code."""

import gc
import json
import os
import re
import subprocess

import pytest
import torch

import overflow_sentinel
from overflow_sentinel import DebugUnderflowOverflow, Watch, _native

from models import Mlp, plant_overflow, tiny_t5
from tiers import both_tiers


def hooks_of(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


# ---- bad input -------------------------------------------------------------------------------

def test_a_model_that_is_not_a_module_is_a_type_error():
    with pytest.raises(TypeError, match="torch.nn.Module, not function"):
        DebugUnderflowOverflow(lambda x: x)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"max_frames": 3}, TypeError, "unexpected keyword argument 'max_frames'"),
    ({"max_frames_to_save": "21"}, TypeError, "max_frames_to_save must be an int, not str"),
    ({"max_frames_to_save": True}, TypeError, "max_frames_to_save must be an int"),
    ({"trace_batch_nums": 3}, TypeError, "trace_batch_nums must be a list, not int"),
    ({"trace_batch_nums": [1, "2"]}, TypeError, "trace_batch_nums\\[1\\] must be an int, not str"),
    ({"max_frames_to_save": 0}, ValueError, "max_frames_to_save"),
    ({"action": "explode"}, ValueError, "action 'explode' is not one of"),
    ({"fp8": {"layers": "fc[1"}}, ValueError, "fc\\[1"),
    ({"fp8": {"enabled": True, "recpies": ["mxfp8"]}}, TypeError, "fp8 has no key 'recpies'"),
    ({"fp8": {"recipes": ["fp9"]}}, ValueError, "fp9"),
    ({"stats_collections": [{"stats": ["median"]}]}, ValueError, "'median' is not one of 'min', 'max'"),
    ({"ranks": {"timeout_seconds": 10.0, "max_wait_seconds": 5.0}}, ValueError, "ranks.max_wait_seconds"),
    ({"stats_collections": [{"stats": ["max_blockwise_dynamic_range"], "blockwise_dims": 3}]}, ValueError,
     "blockwise_dims must be 1 or 2"),
    ({"fp8": {"recipes": ["float8block"], "block_scaling_amax_epsilon": -1.0}}, ValueError, "block_scaling_amax_epsilon"),
    ({"callback": 3}, TypeError, "callback must be callable"),
    ({"config": 3}, TypeError, "config must be a path"),
])
def test_bad_options_name_the_argument(kwargs, error, words):
    model = Mlp()
    with pytest.raises(error, match=words):
        DebugUnderflowOverflow(model, **kwargs)
    assert hooks_of(model) == 0  # nothing was left on the model
    DebugUnderflowOverflow(model).close()  # and it can still be watched


def test_a_missing_config_file_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises((OSError, ValueError), match="nope.yaml"):
        DebugUnderflowOverflow(Mlp(), config=missing)


def test_every_option_name_is_taken():
    names = overflow_sentinel.option_names()
    for expected in ("max_frames_to_save", "trace_batch_nums", "abort_after_batch_num", "action", "report_dir",
                     "fp8", "headroom", "ranks", "dumps", "stats_collections", "log_dir", "loggers"):
        assert expected in names


# ---- removal -----------------------------------------------------------------------------------

@both_tiers
def test_closing_or_collecting_a_watchdog_leaves_the_model_and_torch_as_they_were(tier):
    gc.collect()  # the models of earlier tests, and the watchdogs that live with them
    before = _native.record_function_callbacks_installed()
    scaler_methods = (torch.amp.GradScaler.scale, torch.amp.GradScaler.step)
    model = tiny_t5()
    x = torch.randn(2, 8)
    plain = model(x)
    debug = DebugUnderflowOverflow(model)
    assert hooks_of(model) > 0
    # (At module boundaries an ordinary batch installs none.)
    installed = _native.record_function_callbacks_installed()
    assert installed if tier == "exact" else installed == before
    assert hasattr(torch.amp.GradScaler.scale, "__wrapped__")  # watched: GradScaler's verdicts are heard
    model(x)
    debug.close()
    assert hooks_of(model) == 0
    assert _native.record_function_callbacks_installed() == before
    assert (torch.amp.GradScaler.scale, torch.amp.GradScaler.step) == scaler_methods
    assert torch.equal(model(x), plain)

    watch = Watch(model)  # a Watch collected is closed (DebugUnderflowOverflow lives with the model)
    model(x)
    del watch
    gc.collect()
    assert hooks_of(model) == 0
    assert _native.record_function_callbacks_installed() == before
    DebugUnderflowOverflow(model).close()  # the model is free to be watched again


def test_torchscript_fusion_is_off_while_watched_and_as_it_was_after_the_last_watchdog():
    # A scripted sub-module would otherwise run its elementwise chains as one kernel, unseen.
    before = torch._C._jit_texpr_fuser_enabled()
    models = [tiny_t5(), tiny_t5()]  # each watchdog closes when its model goes
    first = DebugUnderflowOverflow(models[0], exact=True)  # (watching op by op)
    assert not torch._C._jit_texpr_fuser_enabled()
    kept = DebugUnderflowOverflow(models[1], keep_torchscript_fusion=True, exact=True)
    first.close()
    assert torch._C._jit_texpr_fuser_enabled() == before
    kept.close()
    assert torch._C._jit_texpr_fuser_enabled() == before


def test_the_context_manager_closes_its_watchdog():
    model = Mlp()
    with overflow_sentinel.watch(model, max_frames_to_save=5) as w:
        model(torch.randn(3, 16))
        assert len(w.saved_frames()) <= 5
    assert hooks_of(model) == 0
    with pytest.raises(ValueError, match="closed"):
        w.batch_number


def test_a_watchdog_closed_inside_its_own_batch_ends_the_block_quietly(capsys):
    """Closing ends the open batch: the block's exit has nothing left to end, and neither raises
    nor hides the user's own exception."""
    model = Mlp()
    x = torch.randn(3, 16)
    unwatched = model(x)
    w = Watch(model)
    with w.batch():
        assert torch.equal(model(x), unwatched)
        w.close()
    assert hooks_of(model) == 0
    assert torch.equal(model(x), unwatched)
    w = Watch(model)
    with pytest.raises(KeyError, match="the user's own"):
        with w.batch():
            w.close()
            raise KeyError("the user's own")
    assert "closed" not in capsys.readouterr().out


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_thousand_batches_hold_no_more_memory():
    model = tiny_t5()
    debug = DebugUnderflowOverflow(model)
    x = torch.randn(2, 8)
    for _ in range(200):
        model(x).sum().backward()
    settled = rss_bytes()
    for _ in range(1000):
        model(x).sum().backward()
    grown = rss_bytes() - settled
    assert debug.batch_number == 1200
    debug.close()
    # A leak of one frame, tensor or hook closure per batch would be tens of MB here.
    assert grown < 4 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MiB over 1000 batches"


# ---- FP8 metrics, against the native CLI on the same model and tensors ---------------------

def test_fp8_metrics_from_python_equal_the_native_clis_on_the_same_tensors(tmp_path):
    cli = os.environ.get("SENTINEL_CLI")
    if not cli or not os.path.exists(cli):
        pytest.skip("SENTINEL_CLI (the sentinel program) is not set: run through ctest")
    torch.manual_seed(1)
    model = Mlp()
    batches = [torch.randn(8, 16) * 300.0 for _ in range(3)]
    torch.jit.script(model).save(str(tmp_path / "mlp.pt"))
    torch.save(batches, str(tmp_path / "batches.pt"))
    subprocess.run([cli, "run", "--model", str(tmp_path / "mlp.pt"), "--inputs", str(tmp_path / "batches.pt"),
                    "--log-tensor-name-pattern", "fc", "--recipes", "delayed,current,mxfp8",
                    "--report-dir", str(tmp_path / "cli"), "--warn"], check=True, capture_output=True)
    native = {}
    with open(tmp_path / "cli" / "fp8_metrics.jsonl") as lines:
        for line in lines:
            m = json.loads(line)
            native[(m["step"], m["module_path"], m["role"], m["recipe"])] = m
    python = {}
    with overflow_sentinel.watch(model, fp8={"layers": "fc.*", "recipes": ["delayed", "current", "mxfp8"]}) as w:
        for x in batches:
            with torch.no_grad():
                model(x)
            for m in w.fp8_metrics():
                python[(m.step, m.module_path, m.role, m.recipe)] = m.as_dict()
    assert set(python) == set(native) and len(python) >= 2 * 2 * 3
    for key, m in python.items():
        if key[1] == "fc1":
            assert m == native[key], key  # the user's input and the parameters: the same numbers
        else:
            # fc2's activation is fc1's output, which each process's BLAS computed.
            assert m.keys() == native[key].keys(), key
            for name, value in m.items():
                if isinstance(value, float):
                    assert value == pytest.approx(native[key][name], rel=1e-5, abs=1e-30), (key, name)
    # And against the tensors themselves: step 0's activation amax of fc1 is max |x|.
    assert python[(0, "fc1", "activation", "delayed")]["cur_amax"] == float(batches[0].abs().max())


# ---- compiled code ---------------------------------------------------------------------------

def test_a_scripted_sub_module_is_named_once_with_how_to_watch_it(capsys):
    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.jit.script(Mlp())

        def forward(self, x):
            return self.inner(x) * 2

    model = Outer()
    with overflow_sentinel.watch(model):
        model(torch.randn(2, 16))
        model(torch.randn(2, 16))
    out = capsys.readouterr().out
    assert out.count("overflow_sentinel: inner is not watched op by op") == 1
    assert "TorchScript" in out


# ---- a report from planting through the keyword options --------------------------------

def test_headroom_and_max_frames_through_keywords():
    model = tiny_t5()
    with Watch(model, headroom=True, max_frames_to_save=7) as w:
        plant_overflow(model)
        with pytest.raises(overflow_sentinel.NonFiniteError) as caught:
            model(torch.ones(2, 8))
        assert len(caught.value.report.frames) == 7
        assert w.headroom()[0].startswith("frames checked")


# ---- a module built for another Python or torch ------------------------------------------------

@pytest.mark.parametrize("field, value, words", [
    ("torch_version", "2.0.0+cpu", "built against torch 2.0.0+cpu; this Python imports torch"),
    ("python_version", "3.9.18", "built for Python 3.9.18"),
])
def test_a_module_built_for_another_torch_or_python_refuses_to_load_saying_so(monkeypatch, field, value, words):
    from overflow_sentinel import _build_info
    monkeypatch.setattr(_build_info, field, value)
    with pytest.raises(ImportError, match=re.escape(words)) as caught:
        overflow_sentinel._load_native()
    assert "rebuild the module" in str(caught.value)
