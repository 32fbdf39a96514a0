"""Detection tests in both tiers: exact (every op a frame) and the boundary tier (module boundaries,
then a replay op by op at the inf/nan). The `tier` fixture (conftest.py) makes every watchdog the
test builds, through any front end, watch in its tier; `named(error)` is the report that names the
op: exact mode's own, or the boundary tier's replay's. A test asserts the same answers on it in
both."""

import pytest

import overflow_sentinel


def tier_fixture(request, monkeypatch):
    exact = request.param == "exact"
    built = overflow_sentinel.Watch.__init__

    def init(self, model, **options):
        if not self._is_replay:  # (a replay always watches op by op)
            options.setdefault("exact", exact)
        built(self, model, **options)

    monkeypatch.setattr(overflow_sentinel.Watch, "__init__", init)
    return request.param


def named(error):
    """The report that names the op that made the value."""
    replay = getattr(error, "replay", None)
    if replay is not None and replay.report is not None:
        return replay.report
    return error.report


both_tiers = pytest.mark.parametrize("tier", ["exact", "boundary"], indirect=True)
