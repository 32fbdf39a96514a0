"""fp16 AMP: an inf gradient in a step that torch's GradScaler then skips is the scaler's business
(it skips the optimizer step and lowers its scale), not an error.

While a watchdog lives, GradScaler.scale and GradScaler.step are wrapped; the last watchdog to
close puts the originals back. scale() marks the backward that follows as scaled by that scaler.
A watchdog whose scaled backward finds inf/nan holds the error for the scaler instead of raising
it. step() then asks the scaler, before the optimizer can run, whether it found inf/nan in the
gradients (what step() itself asks first): yes, the step is skipped, and each watchdog that held
an error counts it; no, the held error is raised there. An error held when the next forward
starts (no step() came) is raised then. Anything unexpected in the scaler raises the held error:
nothing is hidden."""

import threading
import weakref

import torch

_lock = threading.Lock()
_users = 0
_originals = None
# (generation, weak reference to the scaler) of the last scale() call: a backward is scaled when a
# scale() ran after its forward began.
_generation = 0
_last_scaler = None
# id(scaler) -> [(weak reference to a watchdog, its held error)]
_held = {}


def _scaler_class():
    amp = getattr(torch, "amp", None)
    return getattr(amp, "GradScaler", None) if amp is not None else None


def enter():
    """A watchdog starts: the first one wraps GradScaler."""
    global _users, _originals
    cls = _scaler_class()
    with _lock:
        _users += 1
        if _users > 1 or cls is None:
            return
        _originals = (cls.scale, cls.step)
        cls.scale = _wrap_scale(cls.scale)
        cls.step = _wrap_step(cls.step)


def leave():
    """A watchdog closes: the last one puts GradScaler back as it was."""
    global _users, _originals
    cls = _scaler_class()
    with _lock:
        _users -= 1
        if _users > 0 or _originals is None:
            return
        cls.scale, cls.step = _originals
        _originals = None
        _held.clear()


def generation():
    return _generation


def scaler_since(mark):
    """The scaler whose scale() ran after `mark` (a generation()), or None."""
    if _last_scaler is None or _last_scaler[0] <= mark:
        return None
    return _last_scaler[1]()


def hold(scaler, watch, error):
    with _lock:
        _held.setdefault(id(scaler), []).append((weakref.ref(watch), error))


def forget(watch):
    with _lock:
        for key in list(_held):
            _held[key] = [(w, e) for w, e in _held[key] if w() is not None and w() is not watch]
            if not _held[key]:
                del _held[key]


def _wrap_scale(original):
    def scale(self, outputs):
        global _generation, _last_scaler
        if getattr(self, "_enabled", False):
            _generation += 1
            _last_scaler = (_generation, weakref.ref(self))
        return original(self, outputs)

    scale.__wrapped__ = original
    return scale


def _found_inf(scaler, optimizer):
    """Whether the scaler finds inf/nan in the optimizer's gradients, as step() will: the check it
    would run first (unscale_, or for an optimizer that unscales itself, the check alone)."""
    from torch.amp.grad_scaler import OptState

    state = scaler._per_optimizer_states[id(optimizer)]
    if state["stage"] is OptState.READY:
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            scaler._check_inf_per_device(optimizer)
        else:
            scaler.unscale_(optimizer)
    found = state["found_inf_per_device"]
    if not found:
        raise RuntimeError("the scaler recorded no inf check")
    return sum(v.item() for v in found.values()) > 0


def _wrap_step(original):
    def step(self, optimizer, *args, **kwargs):
        with _lock:
            held = _held.pop(id(self), [])
        held = [(w(), e) for w, e in held if w() is not None]
        if held and getattr(self, "_enabled", False):
            try:
                scale = self.get_scale()
                skipped = _found_inf(self, optimizer)
            except Exception:  # noqa: BLE001 - a scaler this does not know: the error stands
                skipped = False
            if not skipped:
                for watch, error in held:
                    watch._amp_resolved(error)
                raise held[0][1]
            for watch, error in held:
                watch._amp_skipped(error, scale)
        return original(self, optimizer, *args, **kwargs)

    step.__wrapped__ = original
    return step
