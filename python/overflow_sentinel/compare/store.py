"""The float64 reference's tensors at each boundary, kept for the runs that follow: in host memory
up to a cap, on disk beyond it, so a compare's memory is the models plus the cap, whatever the
model's depth."""

import os
import shutil
import tempfile

import torch

DEFAULT_CAP_BYTES = 256 * 2 ** 20


class SpillStore:
    """Tensors by key, on the host; those that would pass `cap_bytes` go to files under
    `directory` (a temporary one by default, removed by close())."""

    def __init__(self, cap_bytes=DEFAULT_CAP_BYTES, directory=None):
        if not isinstance(cap_bytes, int) or cap_bytes < 0:
            raise ValueError(f"overflow_sentinel: compare's memory_cap_bytes is a byte count >= 0, not {cap_bytes!r}")
        self.cap_bytes = cap_bytes
        self._directory = directory
        self._own_directory = None
        self._memory, self._files = {}, {}
        self.bytes_in_memory = 0
        self.peak_bytes_in_memory = 0
        self.bytes_spilled = 0

    def put(self, key, tensor):
        tensor = tensor.detach().to("cpu", copy=True)
        size = tensor.numel() * tensor.element_size()
        self.drop(key)
        if self.bytes_in_memory + size <= self.cap_bytes:
            self._memory[key] = tensor
            self.bytes_in_memory += size
            self.peak_bytes_in_memory = max(self.peak_bytes_in_memory, self.bytes_in_memory)
            return
        if self._directory is None:
            self._own_directory = self._directory = tempfile.mkdtemp(prefix="sentinel-compare-")
        path = os.path.join(self._directory, f"t{len(self._files)}_{abs(hash(key))}.pt")
        torch.save(tensor, path)
        self._files[key] = path
        self.bytes_spilled += size

    def get(self, key, default=None):
        if key in self._memory:
            return self._memory[key]
        if key in self._files:
            return torch.load(self._files[key])
        return default

    def __contains__(self, key):
        return key in self._memory or key in self._files

    def drop(self, key):
        if key in self._memory:
            tensor = self._memory.pop(key)
            self.bytes_in_memory -= tensor.numel() * tensor.element_size()
        if key in self._files:
            os.remove(self._files.pop(key))

    def close(self):
        self._memory.clear()
        self.bytes_in_memory = 0
        for path in self._files.values():
            if os.path.exists(path):
                os.remove(path)
        self._files.clear()
        if self._own_directory:
            shutil.rmtree(self._own_directory, ignore_errors=True)
            self._own_directory = None

    def as_dict(self):
        return {"cap_bytes": self.cap_bytes, "peak_bytes_in_memory": self.peak_bytes_in_memory,
                "bytes_spilled": self.bytes_spilled}
