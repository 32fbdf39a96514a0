"""Reports as Python objects: the JSON report (reports/report.schema.json) with its keys as
attributes, plus the text as printed."""

import json


def _wrap(value, cls=None):
    if isinstance(value, dict):
        return (cls or Record)(value)
    if isinstance(value, list):
        return [_wrap(v, cls) for v in value]
    return value


def _number(value):
    # JSON has no inf or nan: the report writes them as strings.
    if value in ("inf", "-inf", "nan"):
        return float(value)
    return value


class Record:
    """A JSON object whose keys are attributes; `as_dict()` gives the JSON back."""

    _nested = {}

    def __init__(self, data):
        self._data = data
        for key, value in data.items():
            setattr(self, key, _wrap(value, self._nested.get(key)) if isinstance(value, (dict, list)) else _number(value))

    def as_dict(self):
        return self._data

    def __eq__(self, other):
        return isinstance(other, Record) and self._data == other._data

    def __repr__(self):
        return f"{type(self).__name__}({json.dumps(self._data)[:200]})"


class Entry(Record):
    """One tensor of a frame: label ('weight', 'input[0]', 'output', 'grad of weight'), role
    ('parameter', 'input', 'output', 'gradient'), kind, dtype and stats (abs_min, abs_max, nan,
    pos_inf, neg_inf, zeros, subnormal, count)."""


class Frame(Record):
    """One op: module_path (as named_modules() says it), module_class, op ('aten::mul', or the
    autograd node 'MulBackward0'; 'call' / 'return' for what a module was handed or returned),
    direction ('forward', 'backward'), forward_op, recomputed (a forward op gradient
    checkpointing ran again inside the backward), entries."""

    _nested = {"entries": Entry}
    recomputed = False  # the JSON holds the key only when true

    def __str__(self):
        return f"{self.module_path} {self.module_class} {self.op}".strip()


class Report(Record):
    """What the watchdog found: batch_number, frames (oldest first; the last is where inf/nan was
    detected), origin, origin_frame (the op that made a value tolerated inside its module until
    it left, or None), escape ('read', 'written', 'returned' or 'none'), tolerated (per module and
    op), python_stack (the source lines that ran the op, innermost first), kind, fp8_alarms,
    fp8_metrics; `text` is the report as printed (HF's layout). `phase` is 'evaluation' for a
    forward a Trainer ran between its steps (overflow_sentinel.trainer; the JSON's `phase`), else None;
    `gradient_norm_nonfinite` is True when the total gradient norm at clipping is what became
    non-finite, from finite gradients (the step is lost); `mixed_precision` is FSDP's policy at
    work where the report stops in FSDP's machinery ({module, param_dtype, reduce_dtype}), else
    None."""

    _nested = {"frames": Frame, "origin_frame": Frame}
    phase = None
    gradient_norm_nonfinite = False
    mixed_precision = None

    def __init__(self, data, text=None):
        super().__init__(data)
        self.text = text

    @property
    def trigger(self):
        """The frame where inf/nan was detected (None for FP8 alarm reports)."""
        return self.frames[-1] if self.frames else None

    @classmethod
    def from_json(cls, text, rendered=None):
        return cls(json.loads(text), rendered)

    def __str__(self):
        return self.text or json.dumps(self._data, indent=2)
