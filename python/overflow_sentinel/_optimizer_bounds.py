"""An optimizer's states, proven finite instead of read (docs/nonfinite.md, "An optimizer's states,
bounded"). Watched at module boundaries, what an optimizer writes is read after its step; its
states are most of that read (Adam's two per parameter). Each step of a known optimizer updates
them by a recurrence whose largest result follows from a few numbers: the largest magnitude of the
gradients as the step saw them (read after the backward, and again wherever the training loop's
watched ops rewrote them: unscaling, clipping), |p| where L2 weight decay adds it, the states'
own bounds after the step before, the hyperparameters and the states' dtype. Where that bound,
rounding included, stays below the dtype's largest finite value, no state can have become inf or
NaN, and none is read; elsewhere (no proof holds, or a number is not known) they are read, as
before, and their bounds start again from what was read. The parameters the step wrote are
proven the same way where their group's states were: p <- p (1 - lr wd) - lr d, with |d| bounded
by each rule (UPDATE), and |p| carried from step to step."""

import math
import weakref

import torch

# The dtypes a bound is carried in: float16's range is too narrow for one to hold for long.
_BOUNDED_DTYPES = (torch.float32, torch.bfloat16, torch.float64)

# The key of a rule's answer that is no state: the largest |d| of the step's p <- p - lr d.
UPDATE = "the parameters' update"


class Arithmetic:
    """Where the states' arithmetic overflows, and how far its rounding can carry a result above
    the exact one: `up(x)` bounds what a short chain of operations computes for x (every step of
    the kernels rounds once, in the state's dtype or in float32)."""

    def __init__(self, dtypes, on_cpu):
        self.largest = min(torch.finfo(d).max for d in dtypes)
        self.rounding = max(torch.finfo(d).eps for d in dtypes) / 2
        # ATen's CPU kernels compute addcmul's (1 - beta) * g * g left to right; elsewhere (CUDA's
        # foreach kernels) g * g comes first, and must fit by itself.
        self.square_first = not on_cpu

    def up(self, x):
        return x * (1 + 8 * self.rounding)

    def fits(self, *values):
        return all(v < self.largest for v in values)


def _plain_number(*values):
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _gradient_with_decay(group, gradient, parameter, arith, decoupled=False):
    """The gradient the states see: L2 weight decay adds weight_decay * p to it."""
    decay = group.get("weight_decay", 0)
    if not _plain_number(decay) or decay < 0:
        return None, "weight_decay is not a non-negative number"
    if decay == 0 or decoupled:
        return gradient, ""
    if not math.isfinite(parameter):
        return None, "L2 weight decay, and |p| before the step was not read as the step saw it"
    return arith.up(gradient + decay * parameter), ""


def _squared(arith, gradient, weight):
    """What addcmul's (1 - beta) * g * g reaches on the way: g * g first where the device computes
    it first."""
    square = arith.up(gradient * gradient)
    return square if arith.square_first else arith.up(weight * gradient * gradient)


def adam(group, old, gradient, parameter, arith):
    """Adam and AdamW: exp_avg <- b1 exp_avg + (1 - b1) g (a lerp, whose g - exp_avg must fit
    too), exp_avg_sq <- b2 exp_avg_sq + (1 - b2) g^2, max_exp_avg_sq <- max(itself, exp_avg_sq)."""
    beta1, beta2 = group["betas"]
    if not _plain_number(beta1, beta2) or not (0 <= beta1 < 1 and 0 <= beta2 < 1):
        return "betas are not numbers in [0, 1)"
    g, why = _gradient_with_decay(group, gradient, parameter, arith, group.get("decoupled_weight_decay", False))
    if g is None:
        return why
    m, v = old["exp_avg"], old["exp_avg_sq"]
    new = {"exp_avg": arith.up(beta1 * m + (1 - beta1) * g),
           "exp_avg_sq": arith.up(beta2 * v + arith.up((1 - beta2) * g * g))}
    if group.get("amsgrad", False):
        new["max_exp_avg_sq"] = max(old["max_exp_avg_sq"], new["exp_avg_sq"])
    on_the_way = (arith.up(g + m), _squared(arith, g, 1 - beta2))
    if not arith.fits(*new.values(), *on_the_way):
        return "a state could reach the dtype's largest value"
    # d = m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps): the denominator is at least eps, and
    # 1 - beta1^t at least 1 - beta1 from the first step on.
    eps = group["eps"]
    if _plain_number(eps) and eps > 0:
        new[UPDATE] = arith.up(arith.up(new["exp_avg"] / eps) / (1 - beta1))
    return new


def sgd(group, old, gradient, parameter, arith):
    """SGD with momentum: momentum_buffer <- mu buf + (1 - dampening) g."""
    momentum, dampening = group["momentum"], group["dampening"]
    if not _plain_number(momentum, dampening) or not (0 <= momentum < 1 and 0 <= dampening <= 1):
        return "momentum is not in [0, 1), or dampening not in [0, 1]"
    g, why = _gradient_with_decay(group, gradient, parameter, arith)
    if g is None:
        return why if momentum else {}  # (no state to prove; the parameters are read)
    if momentum == 0:
        return {UPDATE: g} if arith.fits(g) else {}
    new = {"momentum_buffer": arith.up(momentum * old["momentum_buffer"] + (1 - dampening) * g)}
    if not arith.fits(*new.values(), g):
        return "a state could reach the dtype's largest value"
    # Nesterov's d = g + momentum buf; else d = buf.
    new[UPDATE] = arith.up(g + momentum * new["momentum_buffer"]) if group.get("nesterov") else new["momentum_buffer"]
    return new


def rmsprop(group, old, gradient, parameter, arith):
    """RMSprop, not centered: square_avg <- alpha sa + (1 - alpha) g^2; with momentum,
    momentum_buffer <- mu buf + g / (sqrt(sa) + eps), where g / (sqrt(sa) + eps) is at most
    g / eps, and at most 1 / sqrt(1 - alpha) where g^2 does not underflow (sa >= (1 - alpha) g^2)."""
    alpha, momentum, eps = group["alpha"], group["momentum"], group["eps"]
    if group.get("centered", False):
        return "centered: sqrt(sa - grad_avg^2) can be 0"
    if not _plain_number(alpha, momentum, eps) or not (0 <= alpha < 1 and 0 <= momentum < 1):
        return "alpha or momentum is not a number in [0, 1)"
    g, why = _gradient_with_decay(group, gradient, parameter, arith)
    if g is None:
        return why
    new = {"square_avg": arith.up(alpha * old["square_avg"] + arith.up((1 - alpha) * g * g))}
    step = math.inf  # |g / (sqrt(sa) + eps)|
    if eps > 0:
        # Below `small` g * g underflows (to a subnormal or zero, in float32 or the state's dtype).
        small = 2 * math.sqrt(torch.finfo(torch.float32).tiny)
        step = arith.up(min(g / eps, max(arith.up(1 / math.sqrt(1 - alpha)), small / eps)))
    if momentum > 0:
        if not eps > 0:
            return "eps = 0: g / sqrt(sa) can divide by zero"
        new["momentum_buffer"] = arith.up(momentum * old["momentum_buffer"] + step)
    on_the_way = (g, _squared(arith, g, 1 - alpha))
    if not arith.fits(*new.values(), *on_the_way):
        return "a state could reach the dtype's largest value"
    new[UPDATE] = new["momentum_buffer"] if momentum > 0 else step
    return new


# By exact class: a subclass may change the step.
RULES = {torch.optim.Adam: adam, torch.optim.AdamW: adam, torch.optim.SGD: sgd, torch.optim.RMSprop: rmsprop}


def _states_of(optimizer, group):
    """(key, tensor) of each state of the group's parameters that a step updates (not `step`)."""
    return [(key, value) for p in group["params"] for key, value in optimizer.state.get(p, {}).items()
            if isinstance(value, torch.Tensor) and value.dim() > 0]


def _scale_at_least_one(scaler):
    scale = getattr(scaler, "_scale", None)
    if not getattr(scaler, "_enabled", True):
        return True  # (it scales nothing)
    return isinstance(scale, torch.Tensor) and scale.device.type == "cpu" and scale.item() >= 1


class StateBounds:
    """One optimizer's states' bounds, carried from step to step (one per key and parameter
    group: the largest magnitude of that state in the group). `why_read` says why the last step's
    states were read ("" where every group's were proven); `proven_parameters` maps the index of
    each group whose parameters the last step's proof covers to their largest |p| after it."""

    def __init__(self, optimizer):
        self._rule = RULES.get(type(optimizer))
        self._bounds = {}  # group index -> {key: bound}
        self._after_step = []  # (weak reference, version) of every state after the last step
        self._unchanged = False  # checked before the step: no state written since the last one
        self._parameters = {}  # group index -> |p| before the step (read, or proven at the step before)
        self.why_read = "no step seen yet"
        self.proven_parameters = {}

    def before_step(self, native, optimizer):
        """The step's pre-hook: whether the states are as the last step left them, and |p|."""
        self._unchanged = bool(self._after_step) and all(
            ref() is not None and ref()._version == version for ref, version in self._after_step)
        self._parameters = {}
        if self._rule is None:
            return
        for index, group in enumerate(optimizer.param_groups):
            self._parameters[index] = native.read_magnitude(list(group["params"]))

    def unproven_groups(self, native, optimizer, scaler=None):
        """After the step: the indices of the groups whose states must be read; the others' new
        bounds are carried. `scaler`: the GradScaler that scaled the step's backward, if any."""
        groups = range(len(optimizer.param_groups))
        self.proven_parameters = {}
        why = self._why_none_holds(optimizer, scaler)
        if why:
            self.why_read = why
            return list(groups)
        unproven, reasons = [], []
        for index, group in enumerate(optimizer.param_groups):
            new = self._prove(native, optimizer, index, group)
            if isinstance(new, str):
                unproven.append(index)
                reasons.append(new)
            else:
                update = new.pop(UPDATE, None)
                self._bounds[index] = new
                bound = self._parameter_bound(index, group, update)
                if bound is not None:
                    self.proven_parameters[index] = bound
        self.why_read = "; ".join(dict.fromkeys(reasons))
        return unproven

    def states_of(self, optimizer, groups):
        return [t for index in groups for _, t in _states_of(optimizer, optimizer.param_groups[index])]

    def after_reading(self, native, optimizer, groups):
        """The read groups' bounds start again from what was read; the states' versions are kept."""
        for index in groups:
            by_key = {}
            for key, t in _states_of(optimizer, optimizer.param_groups[index]):
                by_key.setdefault(key, []).append(t)
            self._bounds[index] = {key: native.read_magnitude(ts) for key, ts in by_key.items()}
        self._after_step = [(weakref.ref(t), t._version) for group in optimizer.param_groups
                            for _, t in _states_of(optimizer, group)]

    def _why_none_holds(self, optimizer, scaler):
        if self._rule is None:
            return f"no bound is known for {type(optimizer).__name__}"
        now = [t for group in optimizer.param_groups for _, t in _states_of(optimizer, group)]
        if not now:
            return ""  # nothing to read (SGD without momentum)
        if not self._after_step:
            return "the step made the states"
        if not self._unchanged:
            return "the states were not all read or proven at the step before, or were written since"
        if len(now) != len(self._after_step) or any(ref() is not t for (ref, _), t in zip(self._after_step, now)):
            return "the step made new states"
        if getattr(optimizer, "grad_scale", None) is not None:
            return "a GradScaler unscales the gradients inside the step"
        if scaler is not None and not _scale_at_least_one(scaler):
            # Its unscaling writes the gradients without counting a version: where the loop's
            # window did not see it, the magnitude read is the scaled one, no smaller unless the
            # scale is below 1.
            return "a GradScaler's scale below 1 (or on a device)"
        if torch.distributed.is_available() and torch.distributed.is_initialized() and \
                torch.distributed.get_world_size() > 1:
            return "several ranks: the gradients read are this rank's"
        return ""

    def _prove(self, native, optimizer, index, group):
        if isinstance(group.get("lr"), torch.Tensor) or group.get("capturable", False):
            return "a tensor lr or capturable: the step's numbers live on the device"
        states = _states_of(optimizer, group)
        old = self._bounds.get(index, {})
        if any(not math.isfinite(old.get(key, math.nan)) for key, _ in states):
            return "a state's bound is not known"
        if any(t.dtype not in _BOUNDED_DTYPES for _, t in states):
            return "a state is not float32, bfloat16 or float64"
        grads = [p.grad for p in group["params"] if p.grad is not None]
        if not grads:
            return old  # nothing was updated
        gradient = native.read_magnitude(grads)
        if not math.isfinite(gradient):
            return "the gradients were not all read as the step saw them"
        arith = Arithmetic({t.dtype for _, t in states} or {grads[0].dtype},
                           all(t.device.type == "cpu" for _, t in states))
        new = self._rule(group, old, gradient, self._parameters.get(index, math.nan), arith)
        if isinstance(new, dict) and set(new) - {UPDATE} != {key for key, _ in states}:
            return "the group's states are not the ones its bound carries"
        return new

    def _parameter_bound(self, index, group, update):
        return parameter_bound(group, update, self._parameters.get(index, math.nan))


def parameter_bound(group, update, before):
    """The largest |p| a step can leave in `group`, p <- p (1 - lr wd) - lr d with |d| at most
    `update` (a rule's UPDATE), from |p| at most `before` ahead of it; None where that is not
    known or could overflow the parameters' dtype."""
    lr, decay, params = group.get("lr"), group.get("weight_decay", 0), group["params"]
    if (update is None or not math.isfinite(before) or not params or not _plain_number(lr, decay)
            or any(p.dtype not in _BOUNDED_DTYPES or p.device.type != "cpu" for p in params)):
        return None
    arith = Arithmetic({p.dtype for p in params}, on_cpu=True)
    step = arith.up(abs(lr) * update)
    # (Decoupled decay shrinks p first; L2's is in d. Either way |1 - lr wd| is at most this.)
    bound = arith.up(arith.up(max(1.0, abs(1 - lr * decay)) * before) + step)
    return bound if arith.fits(update, step, bound) else None
