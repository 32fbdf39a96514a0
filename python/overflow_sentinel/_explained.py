"""What names the op behind a boundary's report: the eager replay of its batch (_replay.py), of a
compiled model's calls (_compiled.py) or of an eager model watched at its module boundaries. An
error raised carries it (explain). With action "warn" or "callback", which raise nothing, each
report a native call delivered is replayed once that call has returned, at most once per place it
names (Deliveries): the replay's report is printed after the boundary's, and a callback gets the
report with its `.replay`."""

import sys
import types

from . import _compiled
from ._report import Report


def explain(watch, error):
    """A compiled model, or one watched at its module boundaries: what the replay of the error's
    batch, op by op, finds goes with it (`error.replay`, `error.report.replay`)."""
    if error.report is None or getattr(error, "replay", None) is not None:
        return
    if watch._boundaries:
        watch._flush()
        error.replay = _compiled.explain(watch._boundaries, error)
        error.report.replay = error.replay
    elif watch._boundary_calls is not None:
        watch._flush()
        replay = watch._boundary_calls.explain(error)
        if replay is not None:
            error.replay = error.report.replay = replay


def _replays(watch):
    """Whether `watch` replays what it finds: a compiled model's boundaries, or module boundaries."""
    return (not watch._is_replay and not watch._native.closed
            and (bool(watch._boundaries) or watch._boundary_calls is not None))


class Deliveries:
    """The reports delivered without raising during a watchdog's native calls, and the places
    already replayed (a run that goes on may find the same overflow at every step: it is replayed
    once)."""

    def __init__(self):
        self.depth = 0  # native calls in progress (_call)
        self.held = []  # (report, callback): reports for the callback, replayed first
        self.printed = None  # the JSON of the last report printed (action "warn")
        self.places = set()

    def hold(self, watch, report, callback):
        """A report for the callback, held until the native call that delivers it returns, when
        it can be replayed; False (the callback is called now) outside a native call."""
        if self.depth == 0 or not _replays(watch):
            return False
        self.held.append((report, callback))
        return True

    def after_call(self, watch, printed):
        """A native call returned without raising, having printed `printed`: its reports are
        replayed (a printed one is action "warn"'s), then handed to the callback."""
        if self.depth > 0:
            return
        if printed and _replays(watch) and watch._native.warns:
            latest = watch._native.last_report_json()
            if latest is not None and latest != self.printed:
                self.printed = latest
                self._replay(watch, Report.from_json(latest))
        held, self.held = self.held, []
        for report, callback in held:
            self._replay(watch, report)
            try:
                callback(report)
            except Exception as error:  # noqa: BLE001 - as the native side treats a callback that throws
                sys.stdout.write(f"sentinel: the report callback threw: {error}\n")
                sys.stdout.flush()

    def _replay(self, watch, report):
        trigger = report.trigger
        place = (trigger.module_path, trigger.direction, trigger.op) if trigger is not None else None
        if place is None or place in self.places or getattr(report, "kind", "nonfinite") != "nonfinite":
            return
        self.places.add(place)
        try:
            explain(watch, types.SimpleNamespace(report=report))
        except Exception as error:  # noqa: BLE001 - the run goes on: the report stands without its replay
            sys.stdout.write(f"overflow_sentinel: batch {report.batch_number} could not be replayed: "
                             f"{type(error).__name__}: {error}\n")
            sys.stdout.flush()
