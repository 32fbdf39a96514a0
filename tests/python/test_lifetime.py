"""How long a watchdog lives. DebugUnderflowOverflow lives as Hugging Face's does, through the hooks
it put on the model: as long as the model, whether or not the caller keeps it, and a new one on the
same model replaces it. Watch keeps its own scope. Neither keeps the model alive."""

import gc
import weakref

import pytest
import torch

import overflow_sentinel
from overflow_sentinel import DebugUnderflowOverflow, NonFiniteError, Watch, _native

from models import plant_overflow, tiny_t5


def hooks_of(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def watchdog_of(model):
    ref = overflow_sentinel.Watch._of_model.get(model)
    return None if ref is None else ref()


def test_a_watchdog_kept_by_no_name_still_stops_at_the_overflow():
    # As Trainer calls HF's class: the object is not kept.
    model = tiny_t5()
    DebugUnderflowOverflow(model)
    gc.collect()
    model(torch.ones(2, 8))
    plant_overflow(model)
    with pytest.raises(NonFiniteError) as caught:
        model(torch.ones(2, 8))
    assert caught.value.report.batch_number == 1
    assert "DenseReluDense" in caught.value.report.trigger.module_path


def test_the_model_collected_leaves_no_watchdog_and_no_reference_to_itself():
    gc.collect()  # the models of earlier tests, and their watchdogs
    before = _native.record_function_callbacks_installed()
    model = tiny_t5()
    seen = []
    # A callback that names the model: the cycle it makes must still be collectable.
    DebugUnderflowOverflow(model, callback=lambda report: seen.append((model, report)))
    model(torch.ones(2, 8))
    model_ref = weakref.ref(model)
    watchdog_ref = weakref.ref(watchdog_of(model))
    del model
    gc.collect()
    assert model_ref() is None
    assert watchdog_ref() is None
    assert _native.record_function_callbacks_installed() == before


def test_a_kept_watchdog_closes_when_its_model_is_collected():
    gc.collect()
    before = _native.record_function_callbacks_installed()
    model = tiny_t5()
    kept = DebugUnderflowOverflow(model)
    model(torch.ones(2, 8))
    model_ref = weakref.ref(model)
    del model
    gc.collect()
    assert model_ref() is None
    assert kept._native.closed
    assert _native.record_function_callbacks_installed() == before
    kept.close()  # closing again is harmless


def test_constructing_it_again_replaces_the_older_one():
    # Trainer makes one at every train().
    model = tiny_t5()
    first = DebugUnderflowOverflow(model)
    hooks_of_one = hooks_of(model)
    model(torch.ones(2, 8))
    assert first.batch_number == 1
    second = DebugUnderflowOverflow(model)
    assert first._native.closed
    assert hooks_of(model) == hooks_of_one
    assert watchdog_of(model) is second
    model(torch.ones(2, 8))
    assert second.batch_number == 1  # counted by the newer one alone, from 0 as HF's
    plant_overflow(model)
    with pytest.raises(NonFiniteError):
        model(torch.ones(2, 8))


def test_a_watch_keeps_its_scope_and_refuses_a_second_watchdog():
    model = tiny_t5()
    w = Watch(model)
    with pytest.raises(ValueError, match="already watched"):
        Watch(model)
    with pytest.raises(ValueError, match="already watched"):
        DebugUnderflowOverflow(model)  # a Watch in force is the user's: not replaced
    del w
    gc.collect()
    assert hooks_of(model) == 0  # a Watch dropped is closed
    debug = DebugUnderflowOverflow(model)
    with pytest.raises(ValueError, match="already watched"):
        Watch(model)
    debug.close()
    Watch(model).close()


def test_options_that_fail_leave_the_older_watchdog_watching():
    model = tiny_t5()
    first = DebugUnderflowOverflow(model)
    with pytest.raises(ValueError, match="action 'explode'"):
        DebugUnderflowOverflow(model, action="explode")
    assert not first._native.closed
    assert watchdog_of(model) is first
    first.close()
