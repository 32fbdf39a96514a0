"""Where inside a compiled graph an inf/nan first appears, for the replay that did not reproduce
it eagerly (_replay.py): the region is compiled once more with Inductor's intermediate hooks and a
compiler that keeps the graph it lowers (its nodes carry the Python lines they came from), and
run on the failing call. The first non-finite buffer a hook sees is named, else the graph's first
non-finite result; both by their FX node, its ATen op and its source line. (Inductor's C++ kernels
on the CPU call no hooks for the buffers they fuse: there, the buffers are extern kernels' and the
graph's results.)"""

import torch


def first_nonfinite_in_graph(model, call, restored):
    """Lines naming the buffer, or one saying why none could be named."""
    from torch._inductor import compile_fx, hooks
    import torch._inductor.config as inductor_config

    graphs = []

    def keep_graph(gm, example_inputs, **kwargs):
        graphs.append(gm)
        return compile_fx.compile_fx_inner(gm, example_inputs, **kwargs)

    def backend(gm, example_inputs):
        with inductor_config.patch(generate_intermediate_hooks=True, fx_graph_cache=False):
            return compile_fx.compile_fx(gm, example_inputs, inner_compile=keep_graph)

    first = []

    def hook(name, value):
        if not first and isinstance(value, torch.Tensor) and value.is_floating_point() and not _finite(value):
            first.append(name)

    probe = torch.compile(model, backend=backend)
    # Without gradients the graph's results are the call's own, in order.
    with restored(call), hooks.intermediate_hook(hook), torch.no_grad():
        output = probe(*call.args, **call.kwargs)
    if first:
        node = _node(graphs, first[0])
        return [f"inside the compiled graph the first non-finite buffer is {_describe(node, first[0])}"]
    results = [t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
    bad = next((i for i, t in enumerate(results) if t.is_floating_point() and not _finite(t)), None)
    if bad is None:
        return ["compiled again, the graph stayed finite on this call: the buffer inside it is not named"]
    node = _result_node(graphs, bad)
    name = node.name if node is not None else f"result {bad}"
    return [f"inside the compiled graph the first non-finite value is its result {_describe(node, name)}, "
            "computed in a fused kernel (the values it fuses are not kept apart)"]


def _finite(t):
    return bool(torch.isfinite(t).all())


def _node(graphs, name):
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.name == name:
                return node
    return None


def _result_node(graphs, index):
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op == "output":
                results = torch.utils._pytree.tree_leaves(node.args[0])
                if index < len(results) and hasattr(results[index], "name"):
                    return results[index]
    return None


def _describe(node, name):
    if node is None:
        return name
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    where = ""
    if len(trace) >= 2 and trace[-2].strip().startswith("File "):
        # '  File "/path/models.py", line 12, in forward' and the line's code after it.
        parts = trace[-2].strip().split(", ")
        path = parts[0][len('File "'):-1]
        line = parts[1].replace("line ", "") if len(parts) > 1 else "?"
        where = f", made at {path}:{line}: {trace[-1].strip()}"
    return f"{name} ({node.target}){where}"
