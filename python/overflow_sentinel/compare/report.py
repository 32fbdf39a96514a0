"""What a compare found, as a value: the one-line verdict, the rows of aligned modules, text, JSON
(`"kind": "compare"`) and a self-contained HTML page with the first divergence marked."""

import html
import json
import math

SCHEMA_VERSION = 1


def _ratio(entry):
    if not entry or entry.get("tolerance") is None:
        return None
    return entry["error"] / entry["tolerance"] if entry["tolerance"] > 0 else math.inf


def _backward_ratio(row):
    """The worst of a row's backward results past the module: its input's gradient and its
    parameters' gradients, as a share of their tolerances."""
    ratios = [_ratio(v) for k, v in row["backward"].items() if k == "gin" or k.startswith("p:")]
    ratios = [r for r in ratios if r is not None]
    return max(ratios) if ratios else None


def _fmt(x):
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.3e}"


def _share(x):
    return "-" if x is None else f"{x:.4f}"


def _clean(value):
    """JSON has no inf or nan: they are written as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class CompareResult:
    """The outcome of overflow_sentinel.compare: `verdict` (one line), `agree`, `first` (the first
    divergence as a dict, or None), `rows`, `text`, `as_dict()`, `html()`, `write(path)`."""

    def __init__(self, pairs, rows, order, first, confirmation, tolerance, only_candidate, only_reference,
                 suggestions, findings, memory, weights_checked, backward, precision, compiled, seconds=None):
        self.pairs, self.tolerance = pairs, tolerance
        self.only_candidate, self.only_reference, self.suggestions = only_candidate, only_reference, suggestions
        self.findings, self.memory, self.weights_checked = findings, memory, weights_checked
        self.precision, self.compiled, self.backward_run = precision, compiled, backward
        self.seconds = seconds or {}     # each phase's wall time: where a compare's cost goes
        self.order = [k for k in order if k in rows]
        self.rows = [self._row(rows[k]) for k in self.order]
        self.first = None
        if first is not None:
            self.first = self._divergence(rows[first], "forward", confirmation)
        elif backward:
            for key in reversed(self.order):   # backward runs in the forward's completion order reversed
                row = rows[key]
                gout = _ratio(row["backward"].get("gout"))
                worst = _backward_ratio(row)
                if worst is not None and worst > 1 and (gout is None or gout <= 1):
                    self.first = self._divergence(row, "backward", None)
                    break
        if self.first is not None:
            for row in self.rows:
                row["first"] = row["pair"] == self.first["pair"] and row["call"] == self.first["call"]
        self.agree = self.first is None

    def _row(self, raw):
        pair = self.pairs[raw["pair"]]
        out = dict(raw, candidate=pair.candidate, reference=pair.reference, matched_by=pair.matched_by,
                   label=pair.label(), first=False)
        fwd = _ratio(raw["forward"].get("out"))
        bwd = _backward_ratio(raw)
        out["status"] = "over" if (fwd or 0) > 1 or (bwd or 0) > 1 else "within"
        return out

    def _divergence(self, raw, direction, confirmation):
        pair = self.pairs[raw["pair"]]
        if direction == "forward":
            out, inp = raw["forward"].get("out"), raw["forward"].get("in")
            worst_kind = "out"
        else:
            inp = raw["backward"].get("gout")
            worst_kind = max((k for k in raw["backward"] if k == "gin" or k.startswith("p:")),
                             key=lambda k: _ratio(raw["backward"][k]) or 0)
            out = raw["backward"][worst_kind]
        return {"pair": raw["pair"], "call": raw["call"], "candidate": pair.candidate, "reference": pair.reference,
                "label": pair.label(), "direction": direction, "at": worst_kind, "metric": self.tolerance.metric,
                "error": out["error"], "tolerance": out["tolerance"], "baseline": out["baseline"],
                "input_error": inp["error"] if inp else None, "input_tolerance": inp["tolerance"] if inp else None,
                "worst": out.get("worst"), "confirmation": confirmation}

    @property
    def verdict(self):
        tol = self.tolerance
        if self.first is None:
            checked = "forward and backward" if self.backward_run else "forward"
            return (f"agree: {len(self.rows)} module boundaries {checked} within tolerance "
                    f"({tol.format}: {tol.multiple:g} x the baseline's {tol.metric}, floor {tol.floor:.1e})")
        f = self.first
        where = {"out": "output", "gin": "input gradient"}.get(f["at"], f"gradient of {f['at'][2:]}")
        into = "grad_output" if f["direction"] == "backward" else "input"
        line = (f"diverges: {f['direction']} at {f['label']}: {where} {tol.metric} {_fmt(f['error'])} > tolerance "
                f"{_fmt(f['tolerance'])} while its {into} {_fmt(f['input_error'])} <= {_fmt(f['input_tolerance'])}")
        c = f.get("confirmation")
        if c and c.get("ran"):
            line += ("; the module alone on the reference's input reproduces it" if c["reproduced"] else
                     "; the module alone on the reference's input does not reproduce it") + f" ({_fmt(c['error'])})"
        return line

    def as_dict(self):
        return _clean({
            "kind": "compare", "version": SCHEMA_VERSION, "verdict": self.verdict, "agree": self.agree,
            "first_divergence": self.first, "tolerance": self.tolerance.as_dict(), "precision": self.precision,
            "rows": [{k: v for k, v in r.items()} for r in self.rows],
            "pairs": [{"candidate": p.candidate, "reference": p.reference, "matched_by": p.matched_by,
                       "compared": p.compared, "note": p.note} for p in self.pairs],
            "only_candidate": self.only_candidate, "only_reference": self.only_reference,
            "suggestions": self.suggestions, "preflight": self.findings, "memory": self.memory,
            "weights_checked": self.weights_checked, "compiled": self.compiled, "seconds": self.seconds,
        })

    @property
    def text(self):
        lines = [self.verdict, "",
                 f"precision: {self.precision}; tolerance: {self.tolerance.as_dict()}",
                 f"weights checked equal after mapping: {self.weights_checked} parameters", "",
                 f"{'':2}{'candidate <-> reference':60} {'in err':>10} {'out err':>10} {'tolerance':>10} "
                 f"{'cosine':>9} {'bwd/tol':>8}"]
        for r in self.rows:
            out, inp = r["forward"].get("out", {}), r["forward"].get("in", {})
            bwd = _backward_ratio(r)
            mark = ">>" if r["first"] else ("! " if r["status"] == "over" else "  ")
            call = f" #{r['call']}" if r["call"] else ""
            lines.append(f"{mark}{(r['label'] + call)[:60]:60} {_fmt(inp.get('error')):>10} {_fmt(out.get('error')):>10} "
                         f"{_fmt(out.get('tolerance')):>10} {out.get('cosine', float('nan')):>9.6f} "
                         f"{'-' if bwd is None else f'{bwd:.2f}':>8}")
        lines.append("")
        lines.append("matched: " + "; ".join(f"{p.label()} ({p.matched_by}{', ' + p.note if p.note else ''})"
                                            for p in self.pairs))
        if self.only_candidate:
            lines.append("candidate only: " + ", ".join(self.only_candidate))
        if self.only_reference:
            lines.append("reference only: " + ", ".join(self.only_reference))
        for s in self.suggestions:
            lines.append(f"suggested mapping: {s}")
        for f in self.findings:
            lines.append(f"pre-flight: {f}")
        lines.append(f"memory: {self.memory}")
        lines.append(f"seconds: {self.seconds}")
        return "\n".join(lines) + "\n"

    def __str__(self):
        return self.text

    def html(self):
        e = html.escape
        rows = []
        for r in self.rows:
            out, inp = r["forward"].get("out", {}), r["forward"].get("in", {})
            bwd = _backward_ratio(r)
            cls = "first" if r["first"] else r["status"]
            worst = out.get("worst") or {}
            rows.append(
                f"<tr class='{cls}'><td>{e(r['candidate'] or '(root)')}</td><td>{e(', '.join(r['reference']) or '(root)')}"
                f"</td><td>{_fmt(inp.get('error'))}</td><td>{_fmt(out.get('error'))}</td><td>{_fmt(out.get('tolerance'))}"
                f"</td><td>{_fmt(out.get('baseline'))}</td><td>{_fmt(out.get('max_abs'))}</td>"
                f"<td>{_share(out.get('within'))}</td>"
                f"<td>{e(str(worst.get('index', '')))} {_fmt(worst.get('candidate'))} / {_fmt(worst.get('reference'))}</td>"
                f"<td>{'-' if bwd is None else f'{bwd:.2f}'}</td><td>{e(r['matched_by'])}</td></tr>")
        one_side = "".join(f"<li>candidate only: {e(p)}</li>" for p in self.only_candidate) + \
            "".join(f"<li>reference only: {e(p)}</li>" for p in self.only_reference) + \
            "".join(f"<li>suggested: <code>{e(s)}</code></li>" for s in self.suggestions)
        findings = "".join(f"<li>{e(f)}</li>" for f in self.findings)
        return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Overflow Sentinel compare</title>
<style>body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}} td:first-child,td:nth-child(2),td:last-child{{text-align:left}}
tr.first{{background:#f8b4b4;font-weight:bold}} tr.over{{background:#fde2c4}} .verdict{{font-size:16px;font-weight:bold}}</style>
</head><body><h1>Compare: candidate against reference</h1>
<p class="verdict">{e(self.verdict)}</p>
<p>Tolerance: {e(self.tolerance.metric)}, {self.tolerance.multiple:g} &times; the baseline's error (the reference run in
the candidate's precision, {e(str(self.precision))}), at least {self.tolerance.floor:.1e}. Errors are against the reference
run in float64. Weights checked equal after mapping: {self.weights_checked}.</p>
<table><tr><th>candidate</th><th>reference</th><th>input error</th><th>output error</th><th>tolerance</th>
<th>baseline</th><th>max abs</th><th>within</th><th>largest error at: candidate / reference</th><th>backward / tol</th><th>matched by</th></tr>
{''.join(rows)}</table>
<h2>One side only</h2><ul>{one_side or '<li>none</li>'}</ul>
<h2>Pre-flight</h2><ul>{findings}</ul>
<p>Memory: {e(str(self.memory))}</p>
</body></html>
"""

    def write(self, path):
        """Writes the report as JSON, HTML or text, by `path`'s ending."""
        path = str(path)
        if path.endswith(".json"):
            content = json.dumps(self.as_dict(), indent=1)
        elif path.endswith(".html") or path.endswith(".htm"):
            content = self.html()
        elif path.endswith(".txt"):
            content = self.text
        else:
            raise ValueError(f"overflow_sentinel: a compare report is written as .json, .html or .txt, not {path!r}")
        with open(path, "w") as f:
            f.write(content)
        return path
