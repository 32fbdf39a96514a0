"""Run by tests/install/pip_package.sh with the Python of an environment the package was pip-installed
into, from a directory outside the checkout: the installed package (not the checkout's build) is
the one imported, the wheel asks for the torch it was built against, and Hugging Face's class as
the drop-in stops a small GPT-2 at an overflow planted in a weight, one batch after a clean one."""

import importlib.metadata
import os
import sys

import torch
import transformers

import overflow_sentinel


def check(condition, what):
    if not condition:
        sys.exit(f"installed_package: {what}")


env_prefix = os.path.realpath(sys.prefix)
check(os.path.realpath(overflow_sentinel.__file__).startswith(env_prefix + os.sep),
      f"overflow_sentinel was imported from {overflow_sentinel.__file__}, not from the environment at {env_prefix}")

requires = importlib.metadata.requires("overflow-sentinel") or []
built_against = torch.__version__.split("+")[0]
check(requires == [f"torch=={built_against}"],
      f"the package requires {requires}; it was built against torch {built_against}")
check(overflow_sentinel.__version__ == importlib.metadata.version("overflow-sentinel"),
      f"the module says version {overflow_sentinel.__version__}, the package "
      f"{importlib.metadata.version('overflow-sentinel')}")

torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=100,
                                 bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(config).eval()
ids = torch.randint(0, 100, (1, 8))
debug = overflow_sentinel.DebugUnderflowOverflow(model)
with torch.no_grad():
    model(input_ids=ids)  # batch 0: clean
    model.transformer.h[1].mlp.c_fc.weight.mul_(1e37)
    try:
        model(input_ids=ids)
    except overflow_sentinel.NonFiniteError as error:
        check(isinstance(error, ValueError), "NonFiniteError is not a ValueError, as HF's class raises")
        check(error.report.batch_number == 1, f"stopped in batch {error.report.batch_number}, not 1")
        check("Detected inf/nan during batch_number=1" in error.text, f"the report reads:\n{error.text}")
        check("transformer.h.1.mlp.act" in error.text, f"the report does not name the layer that overflowed:\n{error.text}")
        print("installed_package: the drop-in stopped at the planted overflow in batch 1")
    else:
        sys.exit("installed_package: the planted overflow was not detected")
