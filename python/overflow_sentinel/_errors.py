"""What the watchdogs raise. The native side raises these classes itself, from its one exception
translator (src/python/python_module.cpp), with the message and the report as JSON."""

from ._report import Report


class SentinelError(ValueError):
    """What a watchdog raises; a ValueError, as Hugging Face's class raises. `report` is the
    Report (None for AbortAfterBatch), `text` the report as printed."""

    def __init__(self, message, report=None):
        super().__init__(message)
        self.report = report
        self.text = report.text if report is not None else None

    @classmethod
    def _from_native(cls, message, report_json):
        # An error that carries a report has the report's text as its message.
        report = None if report_json is None else Report.from_json(report_json, message)
        return cls(cls._summary(message, report), report)

    @staticmethod
    def _summary(message, report):
        return message


class NonFiniteError(SentinelError):
    """An inf or nan was detected (or, with many ranks, another rank saw one)."""

    @staticmethod
    def _summary(message, report):
        # The report itself is printed already: the exception says where, in HF's words.
        if report is None or report.trigger is None:
            return message
        phase = f" ({report.phase})" if report.phase else ""
        return (f"DebugUnderflowOverflow: inf/nan detected during batch_number={report.batch_number}{phase} at "
                f"{report.trigger}; the report is printed above and in the exception's .report")


class Fp8AlarmError(SentinelError):
    """An FP8 alarm with fp8={'alarm_action': 'raise'}."""


class RanksMissingError(SentinelError):
    """Ranks did not answer the exchange."""


class AbortAfterBatch(SentinelError):
    """abort_after_batch_num was reached."""
