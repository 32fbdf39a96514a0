"""Which candidate module stands for which reference module(s), and how the reference's tensors are
turned into the candidate's form (weights, activations, gradients), checked before anything runs.

A rule maps a candidate path pattern (a regex, matched whole) onto a reference path template: the
template takes the regex's groups (`\\1`) and braces (`{q,k,v}_proj`) that make one candidate module
stand for several. Transforms are small pipelines read left to right, `|` between steps:
`cat(0)`, `stack(0)`, `sum`, `transpose(0,1)`, `permute(1,0,2)`, `reshape(4,-1,64)`,
`chunk(3,0,1)` (the second of three chunks along dim 0). Each turns the reference's tensors into
the candidate's; `cat`, `stack` and `sum` join a group's tensors into one.
"""

import difflib
import itertools
import re

import torch

_STEP = re.compile(r"^\s*(\w+)\s*(?:\(([^)]*)\))?\s*$")
_JOINS = {"cat", "stack", "sum"}
_KNOWN = _JOINS | {"transpose", "permute", "reshape", "chunk", "identity"}
# Containers are never called: their children are.
_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList, torch.nn.ParameterDict)


class Transform:
    """A parsed transform pipeline (or a callable taking the list of the group's tensors)."""

    def __init__(self, spec, where):
        self.spec = spec if isinstance(spec, str) or spec is None else getattr(spec, "__name__", "callable")
        self._callable = spec if callable(spec) else None
        self.steps = []
        if isinstance(spec, str):
            for text in spec.split("|"):
                match = _STEP.match(text)
                if not match or match.group(1) not in _KNOWN:
                    raise ValueError(f"overflow_sentinel: {where}: transform step {text.strip()!r} is not one of "
                                     f"{', '.join(sorted(_KNOWN))} (in {spec!r})")
                try:
                    args = [int(a) for a in match.group(2).split(",")] if match.group(2) else []
                except ValueError:
                    raise ValueError(f"overflow_sentinel: {where}: transform step {text.strip()!r} takes whole "
                                     f"numbers") from None
                self.steps.append((match.group(1), args))
        elif spec is not None and self._callable is None:
            raise TypeError(f"overflow_sentinel: {where}: a transform is a string such as 'cat(0)|transpose(0,1)' "
                            f"or a callable, not {type(spec).__name__}")

    def joins(self):
        return self._callable is not None or any(name in _JOINS for name, _ in self.steps)

    def __call__(self, tensors):
        """The reference's tensors (a list, one per module of the group) in the candidate's form."""
        if self._callable is not None:
            return self._callable(list(tensors))
        value = list(tensors)
        for name, args in self.steps:
            if name in _JOINS:
                value = torch.cat(value, *args) if name == "cat" else (
                    torch.stack(value, *args) if name == "stack" else sum(value[1:], value[0]))
                continue
            apply = {
                "identity": lambda t: t,
                "transpose": lambda t: t.transpose(*args),
                "permute": lambda t: t.permute(*args),
                "reshape": lambda t: t.reshape(*args),
                "chunk": lambda t: t.chunk(args[0], args[1])[args[2]],
            }[name]
            value = [apply(t) for t in value] if isinstance(value, list) else apply(value)
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError(f"overflow_sentinel: transform {self.spec!r} leaves {len(value)} tensors: "
                                 f"a group of modules needs cat, stack or sum to become one")
            value = value[0]
        return value


def _then(first, second):
    """`first` then `second`, as one Transform (either may be None)."""
    if first is None:
        return second
    if second is None:
        return first
    if isinstance(first.spec, str) and isinstance(second.spec, str) and not first._callable and not second._callable:
        return Transform(f"{first.spec}|{second.spec}", "mapping")
    return Transform(lambda ts: second([first(ts)]), "mapping")


class Rule:
    """Candidate modules whose path matches `candidate` (a regex, matched whole) stand for the
    reference module(s) `reference` names (a template: `\\1` for the regex's groups, `{a,b}` for
    several). `weight` turns the reference's parameters into the candidate's (default: `cat(0)`
    for a group, else as they are); `output` and `input` turn its activations and gradients
    (default: the rule's `activation`, else compare's, and `cat(-1)` first for a group's outputs).
    `candidate_class`/`reference_class` (regexes on the class name) scope the rule."""

    def __init__(self, candidate, reference, *, weight=None, output=None, input=None, activation=None,
                 candidate_class=None, reference_class=None):
        for name, value in (("candidate", candidate), ("reference", reference)):
            if not isinstance(value, str):
                raise TypeError(f"overflow_sentinel: Rule's {name} is a string (a path pattern), not "
                                f"{type(value).__name__}")
        try:
            self.pattern = re.compile(candidate)
        except re.error as e:
            raise ValueError(f"overflow_sentinel: Rule({candidate!r}, ...): not a regex: {e}") from None
        self.candidate, self.reference = candidate, reference
        where = f"Rule({candidate!r}, {reference!r})"
        self.weight = Transform(weight, where) if weight is not None else None
        self.output = Transform(output, where) if output is not None else None
        self.input = Transform(input, where) if input is not None else None
        self.activation = Transform(activation, where) if activation is not None else None
        self.candidate_class, self.reference_class = candidate_class, reference_class

    def __repr__(self):
        return f"Rule({self.candidate!r}, {self.reference!r})"


class Pair:
    """One candidate module and the reference module(s) it stands for, with the transforms that
    bring the reference's tensors to the candidate's form."""

    def __init__(self, candidate, reference, matched_by, weight, output, input):
        self.candidate, self.reference, self.matched_by = candidate, list(reference), matched_by
        self.weight, self.output, self.input = weight, output, input
        self.compared = True   # False inside a compiled region, whose inner modules never run eagerly
        self.note = None

    def label(self):
        ref = self.reference[0] if len(self.reference) == 1 else "{" + ", ".join(self.reference) + "}"
        return f"{self.candidate or '(root)'} <-> {ref or '(root)'}"


def _expand_braces(path):
    """`a.{q,k}_proj` -> [`a.q_proj`, `a.k_proj`]."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for option in match.group(1).split(",")
            for p in _expand_braces(path[:match.start()] + option.strip() + path[match.end():])]


def candidate_modules(model):
    """Path -> module of the candidate as users name it (a compiled wrapper's `_orig_mod.` taken
    out), and the paths that are compiled regions' boundaries or lie inside one."""
    modules, inside, boundaries = {}, set(), set()
    compiled_prefixes = []
    for path, module in model.named_modules():
        clean = path.replace("._orig_mod", "").replace("_orig_mod.", "").replace("_orig_mod", "")
        if type(module).__name__ == "OptimizedModule":
            boundaries.add(clean)
            compiled_prefixes.append(clean)
            modules[clean] = module
            continue
        if clean in modules:          # the compiled wrapper's own module: the wrapper stands for it
            continue
        if any(clean == p or p == "" or clean.startswith(p + ".") for p in compiled_prefixes):
            inside.add(clean)
        modules[clean] = module
    return modules, boundaries, inside


def _class_ok(pattern, module):
    return pattern is None or re.fullmatch(pattern, type(module).__name__) is not None


def _closest(path, paths):
    found = difflib.get_close_matches(path, list(paths), n=1, cutoff=0.0)
    return found[0] if found else None


def resolve(candidate, reference, rules, activation=None):
    """The pairs, in the candidate's module order, and what is on one side only. Raises ValueError
    for a rule that matches nothing or names a reference module that does not exist."""
    default_activation = Transform(activation, "compare(activation=...)") if activation is not None else None
    cand, boundaries, inside = candidate_modules(candidate)
    ref = dict(reference.named_modules())
    claimed_cand, claimed_ref, pairs = set(), set(), {}
    for index, rule in enumerate(rules or []):
        if not isinstance(rule, Rule):
            raise TypeError(f"overflow_sentinel: compare's mapping holds Rule objects, not {type(rule).__name__} "
                            f"(item {index})")
        hits = 0
        for path, module in cand.items():
            match = rule.pattern.fullmatch(path)
            if not match or path in claimed_cand or not _class_ok(rule.candidate_class, module):
                continue
            hits += 1
            targets = _expand_braces(match.expand(rule.reference))
            for target in targets:
                if target not in ref:
                    raise ValueError(f"overflow_sentinel: mapping {rule!r} maps candidate module {path!r} onto "
                                     f"reference module {target!r}, which does not exist (closest: "
                                     f"{_closest(target, ref)!r})")
                if not _class_ok(rule.reference_class, ref[target]):
                    raise ValueError(f"overflow_sentinel: mapping {rule!r}: reference module {target!r} is a "
                                     f"{type(ref[target]).__name__}, not {rule.reference_class}")
            activation_t = rule.activation or default_activation
            output = rule.output or (_then(Transform("cat(-1)", "mapping"), activation_t)
                                     if len(targets) > 1 else activation_t)
            # A group's members read the same input: the first one's is the candidate's input.
            input_t = rule.input or activation_t
            weight = rule.weight or (Transform("cat(0)", "mapping") if len(targets) > 1 else None)
            pairs[path] = Pair(path, targets, f"rule {index}: {rule!r}", weight, output, input_t)
            claimed_cand.add(path)
            claimed_ref.update(targets)
        if hits == 0:
            raise ValueError(f"overflow_sentinel: mapping {rule!r} matches no candidate module (closest path: "
                             f"{_closest(rule.candidate, cand)!r})")
    for path, module in cand.items():
        if path in claimed_cand or path not in ref or path in claimed_ref or isinstance(module, _CONTAINERS):
            continue
        pairs[path] = Pair(path, [path], "same path", None, default_activation, default_activation)
        claimed_cand.add(path)
        claimed_ref.add(path)
    ordered = [pairs[p] for p in cand if p in pairs]
    for pair in ordered:
        if pair.candidate in inside:
            pair.compared = False
            pair.note = "inside a compiled region"
    only_candidate = [p for p, m in cand.items() if p not in claimed_cand and not isinstance(m, _CONTAINERS)]
    only_reference = [p for p, m in ref.items() if p not in claimed_ref and not isinstance(m, _CONTAINERS)]
    return ordered, only_candidate, only_reference, boundaries, inside


def _generalize(path):
    """A path as a pattern: its numbers become groups."""
    parts, groups = [], 0
    for piece in re.split(r"(\d+)", path):
        if piece.isdigit():
            parts.append(r"(\d+)")
            groups += 1
        else:
            parts.append(re.escape(piece))
    return "".join(parts)


def _fused_group(module, siblings, ref):
    """Reference siblings of one class whose weights, stacked by rows in module order, have the
    shape of `module`'s weight (a fused QKV or gate/up), or None."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2:
        return None
    fits = [r for r in siblings if isinstance(getattr(ref[r], "weight", None), torch.Tensor)
            and ref[r].weight.shape[1:] == weight.shape[1:] and type(ref[r]) is type(module)]
    for size in range(len(fits), 1, -1):
        for group in itertools.combinations(fits, size):
            if sum(ref[r].weight.shape[0] for r in group) == weight.shape[0]:
                return list(group)
    return None


def _template(path, target):
    """`target` with the numbers it shares in position with `path` written as the pattern's groups."""
    if not re.findall(r"\d+", path) or len(re.findall(r"\d+", path)) != len(re.findall(r"\d+", target)):
        return target
    counter = iter(range(1, 100))
    return re.sub(r"\d+", lambda m: "\\" + str(next(counter)), target)


def suggest(only_candidate, only_reference, candidate, reference):
    """For each candidate module on its side only, the reference module(s) on their side only most
    like it, written as a Rule: siblings whose weights stack into its weight (a fused module,
    written with braces), else one with the same parameter shapes, else of the same class, else
    the closest path. Layers alike give one suggestion."""
    cand, _, _ = candidate_modules(candidate)
    ref = dict(reference.named_modules())
    suggestions = []
    for path in only_candidate:
        if path not in cand:
            continue
        parents = sorted({r.rpartition(".")[0] for r in only_reference})
        parent = _closest(path.rpartition(".")[0], parents)
        group = _fused_group(cand[path], [r for r in only_reference if r.rpartition(".")[0] == parent], ref) \
            if parent is not None else None
        if group:
            names = [r.rpartition(".")[2] for r in group]
            target = f"{parent}.{{{','.join(names)}}}" if parent else f"{{{','.join(names)}}}"
        else:
            same_class = [r for r in only_reference if type(ref[r]).__name__ == type(cand[path]).__name__]
            shapes = sorted(tuple(p.shape) for p in cand[path].parameters(recurse=False))
            same_shapes = [r for r in only_reference
                           if shapes and sorted(tuple(p.shape) for p in ref[r].parameters(recurse=False)) == shapes]
            target = _closest(path, same_shapes or same_class or only_reference)
        if target is None:
            continue
        rule = f"Rule(r'{_generalize(path)}', r'{_template(path, target)}')"
        if rule not in suggestions:
            suggestions.append(rule)
    return suggestions


def check_weights(pairs, candidate, reference):
    """Each pair's candidate parameters equal the reference's after the pair's weight transform,
    cast to the candidate's dtype. Raises ValueError naming the first that does not, or whose
    shapes no transform given reconciles. Returns the number of parameters checked."""
    cand, _, _ = candidate_modules(candidate)
    ref = dict(reference.named_modules())
    checked = 0
    for pair in pairs:
        own = dict(cand[pair.candidate].named_parameters(recurse=False))
        for name, value in own.items():
            members = [dict(ref[r].named_parameters(recurse=False)).get(name) for r in pair.reference]
            if any(m is None for m in members):
                missing = [r for r, m in zip(pair.reference, members) if m is None]
                raise ValueError(f"overflow_sentinel: candidate parameter {_join(pair.candidate, name)!r} has no "
                                 f"counterpart: reference module(s) {missing} hold no parameter {name!r} "
                                 f"({pair.matched_by})")
            mapped = _mapped(pair.weight, members, f"{_join(pair.candidate, name)}")
            if tuple(mapped.shape) != tuple(value.shape):
                how = f"after {pair.weight.spec!r}" if pair.weight else "as they are"
                raise ValueError(f"overflow_sentinel: shapes no transform reconciles at candidate parameter "
                                 f"{_join(pair.candidate, name)!r}: {list(value.shape)} against the reference's "
                                 f"{[list(m.shape) for m in members]} {how}; give the rule a weight= transform, or "
                                 f"map only the enclosing module")
            mapped = mapped.detach().to(device=value.device, dtype=value.dtype)
            if not torch.equal(mapped, value.detach()):
                diff = (mapped.double() - value.detach().double()).abs()
                worst = int(diff.reshape(-1).argmax())
                raise ValueError(f"overflow_sentinel: weights differ after mapping at candidate parameter "
                                 f"{_join(pair.candidate, name)!r} (reference {[_join(r, name) for r in pair.reference]}, "
                                 f"{pair.matched_by}): {int((diff > 0).sum())} of {diff.numel()} elements, the "
                                 f"largest by {float(diff.reshape(-1)[worst]):.3e} at flat index {worst}")
            checked += 1
    return checked


def _mapped(transform, members, where):
    try:
        return transform(members) if transform is not None else members[0]
    except (RuntimeError, IndexError, ValueError) as e:
        raise ValueError(f"overflow_sentinel: shapes no transform reconciles at {where!r}: "
                         f"{transform.spec!r} fails on {[list(m.shape) for m in members]}: {e}") from None


def map_tensors(transform, members):
    """The reference's tensors of one boundary (one per module of the group) in the candidate's form."""
    return transform(members) if transform is not None else (
        members[0] if len(members) == 1 else torch.cat(members, -1))


def _join(path, name):
    return f"{path}.{name}" if path else name
