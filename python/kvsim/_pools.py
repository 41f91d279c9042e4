"""Pools from an engine's own cache tensors (core/engine_presets.hpp).

The extension checks each tensor's shape against the engine's, reads its real
strides (a view such as FlashInfer's ``kv[:, 0]`` is honoured) and builds
kvsim's pool over the caller's memory: ops write in place. Two tensors (K and
V apart) are one pool when V lies after K in memory; otherwise, and for CUDA
tensors, they are staged through host copies that are written back.
"""

from . import _kvsim
from . import _tensors as T
from .errors import BadArgument

_TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "int8",
                 "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
_NUMPY_DTYPES = {"float32": "fp32", "float16": "fp16", "int8": "int8"}


def cache_dtype_of(x, given=None):
    """The kvsim dtype of a cache tensor: `given` wins (uint8 needs it), else the element type."""
    if given:
        return given
    name = str(x.dtype).replace("torch.", "")
    table = _TORCH_DTYPES if T.is_torch(x) else _NUMPY_DTYPES
    if name not in table:
        raise BadArgument(f"bad_argument: a {name} cache needs cache_dtype= (fp8_e4m3, fp8_e5m2, nvfp4 ...)")
    return table[name]


LATENT = "mla"  # kvsim's latent (MLA) pool: one [blocks, page_size, d_ckv + d_kpe] tensor, no engine preset


class Bound:
    """An engine's tensors bound as one kvsim pool; call finish() after the op.

    ``secondary`` (optional): (tensors, scale_tensors) of the same engine and
    geometry but their own block count, bound as the pool's secondary pool
    (offload / onboard). ``engine`` "mla": a latent pool (``tensors`` one
    [blocks, page_size, width] tensor).
    """

    def __init__(self, engine, tensors, cache_dtype, kv_layout, layers, kv_heads, page_size, head_dim,
                 scale_tensors=(), secondary=None):
        self.staged = T.Staged()
        self._copies = []
        args = (engine, cache_dtype, kv_layout, layers, kv_heads, page_size, head_dim)
        self.pools = self._bind(args, tensors, scale_tensors)
        if secondary is not None:
            self.pools = _kvsim.with_secondary(self.pools, self._bind(args, *secondary))

    def _bind(self, args, tensors, scale_tensors):
        host = [self.staged.host(t, written=True) for t in tensors]
        host_scales = [self.staged.host(t, written=True) for t in scale_tensors]
        if args[0] == LATENT:
            return _kvsim.latent_pools(T.as_dlpack(host[0]), args[1],
                                       T.as_dlpack(host_scales[0]) if host_scales else None)
        try:
            return _kvsim.engine_pools(*args, [T.as_dlpack(t) for t in host], [T.as_dlpack(t) for t in host_scales])
        except BadArgument as e:
            if "kv_tensors_unordered" not in str(e) or len(host) != 2:
                raise
            # V before K in memory (or apart by a fraction of an element):
            # run on contiguous copies (V after K) and write both back.
            host = self._stage_pair(host)
            if len(host_scales) == 2:
                host_scales = self._stage_pair(host_scales)
            return _kvsim.engine_pools(*args, [T.as_dlpack(t) for t in host], [T.as_dlpack(t) for t in host_scales])

    def _stage_pair(self, pair):
        copies = T.stack_pair(pair[0], pair[1])
        self._copies.append((pair, copies))
        return list(copies)

    def finish(self):
        for (k, v), (kc, vc) in self._copies:
            T.copy_into(k, kc)
            T.copy_into(v, vc)
        self.staged.finish()
