"""FSDP2 (`fully_shard`): the model's parameters are DTensor shards, which the watchdog reads as
this rank's local tensor, named with the rows the rank holds (`blocks.1.fc2.weight[0:8]`); the
parameters a sharded module's forward reads are unsharded tensors FSDP all-gathers before each
forward, in memory it frees and allocates again at every step (the same storage each time), each
named once it exists by the parameter's full name (`blocks.0.fc1.weight`). docs/python.md."""

import weakref

import torch


def _fsdp_module_class():
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return None
    return FSDPModule


def sharded_module_paths(model):
    """The paths of `model`'s modules fully_shard made (FSDP2), in order."""
    fsdp = _fsdp_module_class()
    return [] if fsdp is None else [path for path, m in model.named_modules() if isinstance(m, fsdp)]


def user_class_name(module):
    """fully_shard makes `FSDP<Class>` (FSDPModule first, the user's class next): the user's name."""
    fsdp = _fsdp_module_class()
    cls = type(module)
    if fsdp is not None and isinstance(module, fsdp):
        for base in cls.__mro__[1:]:
            if base is not fsdp and issubclass(base, torch.nn.Module) and not issubclass(base, fsdp):
                return base.__name__
    return cls.__name__


def shard_rows(param):
    """`[0:8]`: this rank's rows of a DTensor parameter sharded on its first dimension (the slice
    FSDP2 keeps here); "" for other tensors, or where the offset is not known."""
    if not hasattr(param, "device_mesh") or not hasattr(param, "placements"):
        return ""
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    except (ImportError, AttributeError, RuntimeError, TypeError):
        return ""
    return f"[{offset[0]}:{offset[0] + shape[0]}]" if shape else ""


class UnshardedParameters:
    """The parameters of a model's FSDP2 modules: each rank's shard named at once, by the
    parameter's full name and its rows; the unsharded tensors named as they come into being."""

    def __init__(self, model):
        self._pending = []  # (full name, FSDPParam)
        self.shards = []  # (name with rows, local tensor)
        self.sharded = []  # (full name, DTensor parameter)
        fsdp = _fsdp_module_class()
        if fsdp is None:
            return
        for name, param in model.named_parameters():
            local = getattr(param, "_local_tensor", None)
            if isinstance(local, torch.Tensor):
                self.shards.append((name + shard_rows(param), local))
                self.sharded.append((name, param))
        path_of = {id(m): name for name, m in model.named_modules()}
        for module in model.modules():
            if not isinstance(module, fsdp):
                continue
            state = getattr(module, "_get_fsdp_state", lambda: None)()
            group = getattr(state, "_fsdp_param_group", None)
            for param in getattr(group, "fsdp_params", None) or []:
                info = getattr(param, "_module_info", None)
                if info is None or id(info.module) not in path_of:
                    continue
                path = path_of[id(info.module)]
                self._pending.append((f"{path}.{info.param_name}" if path else info.param_name, param))

    @property
    def pending(self):
        return bool(self._pending)

    def name_new(self, watch):
        """Names the unsharded parameters made since the last call (FSDP makes them at its first
        all-gather, in the forward pre-hooks that run before the watchdog's), and their gradients
        as the backward accumulates them (what FSDP casts to reduce_dtype and reduce-scatters)."""
        ready, waiting = [], []
        for name, param in self._pending:
            unsharded = getattr(param, "_unsharded_param", None)
            (ready if isinstance(unsharded, torch.Tensor) else waiting).append((name, param))
        self._pending = waiting
        if not ready:
            return
        watch._native.name_tensors([(name, param._unsharded_param) for name, param in ready])
        me = weakref.ref(watch)
        for name, param in ready:
            unsharded = param._unsharded_param
            if unsharded.requires_grad and hasattr(unsharded, "register_post_accumulate_grad_hook"):
                watch._handles.append(unsharded.register_post_accumulate_grad_hook(_gradient_namer(me, name)))

    def name_sharded_gradients(self, native):
        """Names this rank's shard of each gradient (`blocks.1.fc2.weight.grad[0:8]`): new memory
        after every zero_grad, read by the optimizer's ops."""
        named = []
        for name, param in self.sharded:
            local = getattr(param.grad, "_local_tensor", None)
            if isinstance(local, torch.Tensor):
                # The optimizer's ops are seen as called, on the DTensor; FSDP's on its local tensor.
                label = f"{name}.grad{shard_rows(param)}"
                named += [(label, param.grad), (label, local)]
        if named:
            native.name_tensors(named)


def _gradient_namer(me, name):
    def name_gradient(param):
        w = me()
        if w is not None and not w._native.closed and param.grad is not None:
            w._native.name_tensors([(name + ".grad", param.grad)])
    return name_gradient


def mixed_precision(error, watch):
    """A report stopped in FSDP's machinery (its scopes `FSDP::…`: the all-gather that casts to
    param_dtype, the reduce-scatter in reduce_dtype) says which module's MixedPrecisionPolicy was
    at work: `report.mixed_precision` = {module, param_dtype, reduce_dtype}, said in the message."""
    report = error.report
    trigger = report.trigger if report is not None else None
    model = watch._model_ref()
    if trigger is None or model is None or "FSDP::" not in trigger.module_path:
        return
    # FSDP names its scopes after the module they work for, "FSDP::pre_forward (blocks.1)"; the
    # root's carry no name.
    path = trigger.module_path.rsplit("(", 1)[1].rstrip(")") if trigger.module_path.endswith(")") else ""
    try:
        module = model.get_submodule(path)
        policy = module._get_fsdp_state()._fsdp_param_group.mp_policy
    except AttributeError:
        return
    if policy.param_dtype is None and policy.reduce_dtype is None:
        return  # no cast of FSDP's own: nothing to say
    dtypes = {key: None if dtype is None else str(dtype).replace("torch.", "")
              for key, dtype in (("param_dtype", policy.param_dtype), ("reduce_dtype", policy.reduce_dtype))}
    report.mixed_precision = {"module": path, **dtypes}
    said = (f"FSDP's MixedPrecisionPolicy of {path or 'the root'} ({user_class_name(module)}): "
            f"param_dtype={dtypes['param_dtype']}, reduce_dtype={dtypes['reduce_dtype']}")
    report.origin = f"{report.origin}; {said}"
    error.args = (f"{error.args[0]}; {said}",)
