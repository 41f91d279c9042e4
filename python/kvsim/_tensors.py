"""Tensor plumbing shared by the engine-shaped functions.

Tensors cross into C++ through DLPack. Two things are handled here:

* float8 torch dtypes (``torch.float8_e4m3fn``, ``torch.float8_e5m2``) are
  passed as ``uint8`` views of the same memory (``t.view(torch.uint8)``), with
  the kvsim dtype named explicitly; the extension also reads DLPack 1.0's
  float8 type codes (10 e4m3fn, 12 e5m2) when a producer exports them.
* CUDA tensors: a module built with the CUDA backend (``kvsim.has_cuda``)
  hands them to it as they are, and the op runs there in place; a module
  without it copies them to the host, runs the CPU oracle and copies the
  tensors it wrote back (``Staged``). Host tensors are used in place, strides
  and all. ``host_copy`` is for Python-side code that reads values itself.
"""

import numpy as np

from . import _kvsim

try:
    import torch
except ImportError:  # numpy-only use
    torch = None

_FLOAT8 = {}
if torch is not None:
    for _name, _kv in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")):
        if hasattr(torch, _name):
            _FLOAT8[getattr(torch, _name)] = _kv


def is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def float8_dtype(x):
    """The kvsim dtype a torch float8 tensor holds, or None."""
    return _FLOAT8.get(x.dtype) if is_torch(x) else None


def as_dlpack(x):
    """An object whose __dlpack__ gives x's memory (float8 torch as uint8)."""
    if is_torch(x):
        if x.dtype in _FLOAT8:
            return x.view(torch.uint8)
        if x.dtype == torch.bool:
            raise TypeError("bool tensors are not kvsim element types")
        return x
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return x
    return np.asarray(x)


def int_array(x, dtype=np.int32):
    """A host numpy copy of an index tensor (block tables, positions, ...)."""
    if is_torch(x):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


def on_cuda(x):
    return is_torch(x) and x.is_cuda


class Staged:
    """Host versions of the given tensors; ``finish()`` copies the written ones back.

    A host tensor is itself (in place). A CUDA tensor is copied to a host tensor
    of the same shape and strides class (contiguous), and copied back into the
    original after the op.
    """

    def __init__(self):
        self._back = []

    def host(self, x, written=False):
        if x is None:
            return None
        if on_cuda(x) and not _kvsim.has_cuda:
            h = host_copy(x)
            if written:
                self._back.append((x, h))
            return h
        return x

    def finish(self):
        for dev, h in self._back:
            dev.copy_(h)
        self._back = []


def host_copy(x):
    """x itself on the host; a CUDA tensor's host copy (for code that reads the values)."""
    return x.detach().to("cpu") if on_cuda(x) else x


def empty_like(x):
    if is_torch(x):
        return torch.empty_like(x)
    return np.empty_like(x)


def stack_pair(k, v):
    """Contiguous copies of K and V in one fresh buffer, V right after K (the extension's one pool)."""
    nk = int(np.prod(k.shape))
    nv = int(np.prod(v.shape))
    if is_torch(k):
        flat = torch.empty(nk + nv, dtype=k.dtype, device=k.device)
    else:
        flat = np.empty(nk + nv, dtype=k.dtype)
    kc, vc = flat[:nk].reshape(tuple(k.shape)), flat[nk:].reshape(tuple(v.shape))
    kc[...] = k
    vc[...] = v
    return kc, vc


def copy_into(dst, src):
    if is_torch(dst):
        dst.copy_(src)
    else:
        dst[...] = src
