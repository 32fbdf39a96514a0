"""Compare a port with its reference, module by module, and name the first module that diverges
(forward or backward) by more than its precision explains. See docs/compare.md."""

from .mapping import Rule, Transform
from .recipes import apply_recipe, mx_cast
from .report import CompareResult
from .runner import compare
from .tolerance import FLOOR, MULTIPLE, Tolerance

__all__ = ["compare", "Rule", "Transform", "CompareResult", "Tolerance", "FLOOR", "MULTIPLE", "apply_recipe",
           "mx_cast"]

# The package exports the function under this subpackage's name (overflow_sentinel.compare), which
# hides the subpackage there: the function carries its companions, so that
# overflow_sentinel.compare.Rule reads the same either way.
for _name in __all__:
    if _name != "compare":
        setattr(compare, _name, globals()[_name])
del _name
