"""A replay run where the error is raised, not where the call was made: `watch_steps`, Trainer,
Accelerate and Lightning raise what a step's forward found before its optimizer step. The replay's
stacks go on, outside the model, with the lines the call was made from, as exact mode's do: not
with the optimizer step's line that raised."""

import pytest
import torch
from torch import nn

import overflow_sentinel
from overflow_sentinel import NonFiniteError


def overflow_raised_at_the_step(exact):
    torch.manual_seed(0)
    # torch's own modules only: no line of the model's is the stack's innermost.
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    # Aligned with the first row of the first Linear's weight: that row's output overflows.
    x = model[0].weight[0].detach().sign().expand(4, 6) * 3.4e38
    w = overflow_sentinel.watch_steps(model, optimizer, exact=exact)
    try:
        with pytest.raises(NonFiniteError) as caught:
            model(x)  # THE CALL
            optimizer.step()  # raises what the step's forward found
    finally:
        w.close()
    return caught.value


def test_a_replay_raised_at_the_optimizer_step_shows_the_stack_the_call_was_made_from():
    # (From one line: their stacks are alike to the last frame.)
    exact, boundary = [overflow_raised_at_the_step(exact) for exact in (True, False)]
    assert "# THE CALL" in exact.report.python_stack[0]
    replay = boundary.replay
    assert replay.reproduced
    assert replay.report.python_stack == exact.report.python_stack
    assert "# THE CALL" in replay.origin_line
    # (The boundary's own report was taken as the module returned, in the call.)
    assert "# THE CALL" in boundary.report.python_stack[0]
