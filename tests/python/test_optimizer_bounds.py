"""An optimizer's states proven finite instead of read (docs/nonfinite.md, "An optimizer's states,
bounded"): below each rule's bound every implementation of torch.optim (single-tensor, foreach,
fused) keeps its states finite, the bound is within 2x of where torch's own update first makes
one inf, the carried bound holds what the states hold, and where no proof holds the states are
read, as before. The parameters the step wrote are proven from the same bounds: below them torch's
own update keeps |p| within the bound carried, and where it cannot be carried they are read."""

import math
import random

import pytest
import torch
from torch import nn

import overflow_sentinel
from overflow_sentinel import NonFiniteError
from overflow_sentinel._optimizer_bounds import RULES, UPDATE, Arithmetic, parameter_bound

# The states' signs and the gradient's: two elements alike (the sum's worst) and two opposed (the
# lerp's g - m).
SIGNS = torch.tensor([1.0, -1.0, 1.0, -1.0])
GRADIENT_SIGNS = torch.tensor([1.0, 1.0, -1.0, -1.0])

# name: (class, hyperparameters, the states' magnitudes before the step, |p|)
CASES = {
    "adam": (torch.optim.Adam, {}, {"exp_avg": 0.0, "exp_avg_sq": 0.0}, 1.0),
    "adam_near_the_edge": (torch.optim.Adam, {}, {"exp_avg": 1e19, "exp_avg_sq": 1e37}, 1.0),
    "adam_amsgrad": (torch.optim.Adam, {"amsgrad": True},
                     {"exp_avg": 1e3, "exp_avg_sq": 1e30, "max_exp_avg_sq": 2e30}, 1.0),
    "adam_l2": (torch.optim.Adam, {"weight_decay": 0.1}, {"exp_avg": 1.0, "exp_avg_sq": 1.0}, 1e20),
    "adamw": (torch.optim.AdamW, {"weight_decay": 0.01}, {"exp_avg": 1.0, "exp_avg_sq": 1e36}, 1e30),
    "sgd": (torch.optim.SGD, {"momentum": 0.9}, {"momentum_buffer": 1e38}, 1.0),
    "sgd_dampened_l2": (torch.optim.SGD, {"momentum": 0.5, "dampening": 0.5, "weight_decay": 0.1},
                        {"momentum_buffer": 1e37}, 1e38),
    "sgd_nesterov": (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}, {"momentum_buffer": 1e37}, 1.0),
    "rmsprop": (torch.optim.RMSprop, {}, {"square_avg": 1e36}, 1.0),
    "rmsprop_momentum": (torch.optim.RMSprop, {"momentum": 0.9, "alpha": 0.9},
                         {"square_avg": 1.0, "momentum_buffer": 1e38}, 1.0),
}
IMPLEMENTATIONS = {"single_tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def implementations(cls):
    return [name for name in IMPLEMENTATIONS if name != "fused" or cls is not torch.optim.RMSprop]


def one_step(cls, hyper, implementation, dtype, states, parameter, gradient, with_parameter=False):
    """The states' largest magnitude after one step of torch's own update from `states`, with every
    gradient element of magnitude `gradient` (and |p|'s, as "p", `with_parameter`)."""
    p = nn.Parameter((SIGNS * parameter).to(dtype))
    optimizer = cls([p], lr=1e-3, **hyper, **IMPLEMENTATIONS[implementation])
    p.grad = torch.zeros_like(p)
    optimizer.step()  # makes the states
    with torch.no_grad():
        p.copy_((SIGNS * parameter).to(dtype))
        for key, magnitude in states.items():
            state = optimizer.state[p][key]
            state.copy_((SIGNS.abs() if key.endswith("sq") or key == "square_avg" else SIGNS) * magnitude)
    p.grad = (GRADIENT_SIGNS * gradient).to(dtype)
    optimizer.step()
    tensors = dict(optimizer.state[p], p=p.detach()) if with_parameter else optimizer.state[p]
    return {key: value.abs().max().item() if torch.isfinite(value).all() else math.inf
            for key, value in tensors.items() if value.dim() > 0}


def proven(cls, hyper, dtype, states, parameter, gradient):
    """The rule's bounds after one step, or why it proves nothing."""
    group = cls([nn.Parameter(torch.zeros(1))], lr=1e-3, **hyper).param_groups[0]
    return RULES[cls](group, dict(states), gradient, parameter, Arithmetic({dtype}, on_cpu=True))


def in_dtype(value, dtype):
    return torch.tensor(value, dtype=dtype).item()


def largest_proven(cls, hyper, dtype, states, parameter):
    """The largest gradient magnitude the rule proves (bisected in log space)."""
    low, high = 1e-30, torch.finfo(dtype).max
    assert isinstance(proven(cls, hyper, dtype, states, parameter, low), dict)
    for _ in range(80):
        middle = math.sqrt(low * high)
        if isinstance(proven(cls, hyper, dtype, states, parameter, middle), dict):
            low = middle
        else:
            high = middle
    return low


def edge(cls, hyper, dtype, states, parameter, start):
    """The smallest gradient magnitude at which any implementation makes a state inf or NaN
    (bisected from `start` up; None: none up to the dtype's largest value)."""
    def overflows(g):
        return any(math.isinf(max(one_step(cls, hyper, impl, dtype, states, parameter, g).values()))
                   for impl in implementations(cls))
    low, high = start, torch.finfo(dtype).max
    if not overflows(high):
        return None
    for _ in range(60):
        middle = math.sqrt(low * high)
        if overflows(middle):
            high = middle
        else:
            low = middle
    return high


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_below_the_bound_every_implementation_stays_finite_within_2x_of_the_edge(case, dtype):
    cls, hyper, states, parameter = CASES[case]
    states = {key: in_dtype(value, dtype) for key, value in states.items()}
    parameter = in_dtype(parameter, dtype)
    # (Just below it, so that rounding into the dtype stays below it.)
    limit = largest_proven(cls, hyper, dtype, states, parameter) * (1 - 2**-7)
    # Below the bound, and at it: torch's every implementation keeps its states finite and within
    # the bound the rule carries.
    rng = random.Random(0)
    for g in [limit] + [limit * rng.uniform(1e-6, 1.0) for _ in range(4)]:
        g = in_dtype(g, dtype)
        bounds = proven(cls, hyper, dtype, states, parameter, g)
        assert isinstance(bounds, dict), (g, bounds)
        for impl in implementations(cls):
            after = one_step(cls, hyper, impl, dtype, states, parameter, g)
            for key, magnitude in after.items():
                assert magnitude <= bounds[key], (impl, key, g, magnitude, bounds[key])
            # The parameter, where the rule bounds its update and |p| after it fits: within that.
            group = cls([nn.Parameter(torch.zeros(1, dtype=dtype))], lr=1e-3, **hyper).param_groups[0]
            carried = parameter_bound(group, bounds.get(UPDATE), parameter)
            if carried is not None:
                moved = one_step(cls, hyper, impl, dtype, states, parameter, g, with_parameter=True)["p"]
                assert moved <= carried, (impl, g, moved, carried)
    # Not far below torch's own edge: within 2x of the smallest gradient that overflows a state.
    first_inf = edge(cls, hyper, dtype, states, parameter, limit)
    if first_inf is None:
        assert limit >= torch.finfo(dtype).max / 2
    else:
        assert limit <= first_inf <= 2 * limit, (limit, first_inf)


def watched_steps(optimizer_of, steps=4, loop=None, dtype=torch.float32, seed=0, parameters=None):
    """A small model trained `steps` steps at module boundaries; after each, what the carried
    bounds say against what the states and the parameters hold, and why the states were read
    (appended to `parameters`: the groups whose parameters were proven)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1)).to(dtype)
    optimizer = optimizer_of(model.parameters())
    w = overflow_sentinel.watch_steps(model, optimizer, exact=False)
    bounds = w._state_bounds[0]
    seen = []
    try:
        for _ in range(steps):
            model(torch.randn(4, 6, dtype=dtype)).pow(2).mean().backward()
            if loop is not None:
                loop(model)
            optimizer.step()
            optimizer.zero_grad()
            for index, group in enumerate(optimizer.param_groups):
                held = {}
                for p in group["params"]:
                    for key, value in optimizer.state[p].items():
                        if value.dim() > 0:
                            held[key] = max(held.get(key, 0.0), value.abs().max().item())
                carried = bounds._bounds.get(index, {})
                assert all(held[key] <= carried.get(key, math.nan) for key in held), (held, carried)
                if index in bounds.proven_parameters:
                    largest = max(p.abs().max().item() for p in group["params"])
                    assert largest <= bounds.proven_parameters[index]
            seen.append(bounds.why_read)
            if parameters is not None:
                parameters.append(sorted(bounds.proven_parameters))
    finally:
        w.close()
    return seen


def unscale_by_four(model):
    grads = [p.grad for p in model.parameters()]
    torch._amp_foreach_non_finite_check_and_unscale_(grads, torch.zeros(1), torch.tensor(4.0))


PROVEN = {
    "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
    "adam_foreach_l2": lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.1, foreach=True),
    "adam_amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True, foreach=False),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=1e-4),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.5),
}
LOOPS = {
    "plain": None,
    "clipping": lambda model: nn.utils.clip_grad_norm_(model.parameters(), 0.1),
    # An unscaling that makes the gradients larger (a GradScaler's scale below 1), in place and
    # without counting a version: the bound follows what the loop's watched op wrote.
    "unscaled_up": unscale_by_four,
}


@pytest.mark.parametrize("loop", sorted(LOOPS))
@pytest.mark.parametrize("optimizer", sorted(PROVEN))
def test_after_the_first_step_the_states_are_proven_and_the_bound_holds_them(optimizer, loop):
    parameters = []
    seen = watched_steps(PROVEN[optimizer], loop=LOOPS[loop], parameters=parameters)
    assert seen[0] == "the step made the states"
    assert seen[1:] == ["", "", ""]
    # The parameters too, from the second step on (|p| read after the first).
    assert parameters == [[], [0], [0], [0]]


def test_sgd_without_momentum_has_its_parameters_proven_from_the_second_step():
    parameters = []
    watched_steps(lambda ps: torch.optim.SGD(ps, lr=1e-2), parameters=parameters)
    assert parameters == [[], [0], [0], [0]]


UNPROVEN_PARAMETERS = {
    # float16's range is too narrow for a bound carried step after step
    "float16": (lambda ps: torch.optim.SGD(ps, lr=1e-2), torch.float16),
    # lr m / eps outgrows float32 (though m / (sqrt(v) + eps) stays near 1)
    "adam_eps_1e-40": (lambda ps: torch.optim.Adam(ps, lr=1e-3, eps=1e-40), torch.float32),
}


@pytest.mark.parametrize("case", sorted(UNPROVEN_PARAMETERS))
def test_parameters_whose_bound_would_not_fit_are_read_after_every_step(case):
    make, dtype = UNPROVEN_PARAMETERS[case]
    parameters = []
    seen = watched_steps(make, steps=3, dtype=dtype, parameters=parameters)
    assert seen[1:] == ["", ""]  # (the states are proven)
    assert parameters == [[], [], []]


def write_a_state(optimizer):
    def loop(model):
        state = optimizer[0].state[next(iter(model.parameters()))]
        if not state:
            return  # (made at the first step)
        with torch.no_grad():
            next(v for v in state.values() if v.dim() > 0).mul_(2)
    return loop


UNPROVEN = {
    "adagrad": (lambda ps: torch.optim.Adagrad(ps), "no bound is known for Adagrad"),
    "sgd_momentum_1": (lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=1.0), "momentum is not in [0, 1)"),
    "rmsprop_centered": (lambda ps: torch.optim.RMSprop(ps, centered=True), "centered"),
    "rmsprop_eps_0": (lambda ps: torch.optim.RMSprop(ps, momentum=0.5, eps=0.0), "eps = 0"),
    "tensor_lr": (lambda ps: torch.optim.Adam(ps, lr=torch.tensor(1e-3)), "a tensor lr"),
    "subclass": (lambda ps: type("MyAdam", (torch.optim.Adam,), {})(ps), "no bound is known for MyAdam"),
}


@pytest.mark.parametrize("case", sorted(UNPROVEN))
def test_where_no_proof_holds_every_step_reads_the_states(case):
    make, why = UNPROVEN[case]
    seen = watched_steps(make, steps=3)
    assert all(why in reason for reason in seen[1:]), seen


def test_a_float16_state_is_read():
    seen = watched_steps(lambda ps: torch.optim.Adam(ps, eps=1e-4), steps=3, dtype=torch.float16)
    assert all("not float32, bfloat16 or float64" in reason for reason in seen[1:]), seen


def test_a_state_written_between_steps_is_read_again():
    made = []

    def optimizer_of(ps):
        made.append(torch.optim.Adam(ps, lr=1e-3))
        return made[0]

    seen = watched_steps(optimizer_of, steps=3, loop=write_a_state(made))
    assert all("written since" in reason for reason in seen[1:]), seen


def overflow_adams_state(rewrite):
    """Adam's states overflow at the third step, by `rewrite(model, loss)` of its gradients there."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    w = overflow_sentinel.watch_steps(model, optimizer, exact=False)
    try:
        with pytest.raises(NonFiniteError) as caught:
            for step in range(4):
                loss = model(torch.randn(4, 6)).pow(2).mean()
                rewrite(model, loss) if step == 2 else loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    finally:
        w.close()
    where = caught.value.report.first_nonfinite
    parameter, key = where["tensor"].rsplit(".", 1)
    # As torch finds it in that state.
    state = optimizer.state[dict(model.named_parameters())[parameter]][key]
    assert key == "exp_avg_sq" and math.isinf(state[where["index"]]) and math.isinf(where["value"])
    return w._state_bounds[0].why_read, where


def test_a_gradient_too_large_for_the_bound_has_the_states_read_and_the_inf_named():
    """Gradients whose (1 - beta2) g^2 overflows float32: no proof, the states are read."""
    why, _ = overflow_adams_state(lambda model, loss: (loss * 1e23).backward())
    assert why == "a state could reach the dtype's largest value"


def test_a_gradient_written_through_a_view_has_the_states_read_and_the_inf_named():
    """An element of a gradient set by the loop (a view's write: the gradient itself was not read
    since): its magnitude is not known, and the states are read."""
    def plant(model, loss):
        loss.backward()
        model[1].weight.grad[3, 5] = 1e22  # finite, but (1 - beta2) times its square overflows float32

    why, where = overflow_adams_state(plant)
    assert why == "the gradients were not all read as the step saw them"
    assert where == {"tensor": "1.weight.exp_avg_sq", "index": (3, 5), "value": float("inf")}


@pytest.mark.parametrize("scale", [0.25, 1024.0])
def test_under_a_grad_scaler_the_states_are_proven_only_where_its_scale_is_at_least_one(scale):
    """GradScaler.step unscales the gradients where the loop's window may not see it, without
    counting a version: the magnitude read is then the scaled one, a bound only while the scale
    is at least 1."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=1000)
    w = overflow_sentinel.watch_steps(model, optimizer, exact=False)
    seen = []
    try:
        for _ in range(3):
            scaler.scale(model(torch.randn(4, 6)).pow(2).mean()).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            seen.append(w._state_bounds[0].why_read)
            held = max(v.abs().max().item() for s in optimizer.state.values() for v in s.values() if v.dim() > 0)
            assert held <= max(w._state_bounds[0]._bounds[0].values())
    finally:
        w.close()
    assert seen[1:] == (["", ""] if scale >= 1 else ["a GradScaler's scale below 1 (or on a device)"] * 2), seen
