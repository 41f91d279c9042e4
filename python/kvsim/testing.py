"""Assertions for engine kernel tests.

``assert_cache_equal(actual, expected, engine=..., ...)`` compares the bytes
of two caches of one engine preset (a tensor, or a (K, V) pair of tensors).
On a mismatch it raises AssertionError naming how many elements differ and
the first one as (block, layer, K/V, head, entry, dim), the token and request
it belongs to when a page table is given, both values raw and decoded, and
kvsim's explain steps for that element.
"""

import numpy as np

from . import _tensors as T
from . import codec
from ._pools import cache_dtype_of

_DECODE = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2", "int8": "int8", "bf16": "bf16", "fp16": "fp16"}
_TORCH_VIEW = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


def _host_bytes(x):
    """Element codes of a cache tensor as a numpy array of its own shape (uint8/uint16/uint32)."""
    if T.is_torch(x):
        x = x.detach().cpu()
        name = str(x.dtype).replace("torch.", "")
        if name in _TORCH_VIEW:
            x = x.view(getattr(T.torch, _TORCH_VIEW[name]))
        x = x.numpy()
    x = np.asarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.itemsize])


def _decoded(code, dtype):
    if dtype == "fp32":
        return float(np.array([code], dtype=np.uint32).view(np.float32)[0])
    if dtype == "nvfp4":
        return f"nibbles {code & 0xF:#x} (low) {code >> 4:#x} (high)"
    return float(codec.decode(_DECODE[dtype], np.array([code]))[0])


_COORD = {"blocks": "block", "layers": "layer", "kv": "kv", "heads": "head", "tokens": "entry", "dim": "dim",
          "dim/x": "dim/x", "x": "x", "locations": "location"}


def _coordinates(engine_tensor, index, kv, page_size):
    c = {"layer": 0, "kv": kv}
    for (name, _extent, _stride), i in zip(engine_tensor["axes"], index):
        c[_COORD[name]] = int(i)
    if "location" in c:
        c["block"], c["entry"] = divmod(c.pop("location"), page_size)
    if "dim/x" in c:
        c["dim"] = c.pop("dim/x") * engine_tensor["axes"][-1][1] + c.pop("x")
    return c


def _token_of(block, entry, page_size, block_table, indptr, indices):
    """(request, token) holding (block, entry) in a dense table [n, max] or a CSR table; None if no page maps it."""
    if block_table is not None:
        table = T.int_array(block_table).reshape(len(T.int_array(block_table)), -1)
        for b, row in enumerate(table):
            for page, ref in enumerate(row):
                if ref == block:
                    return b, page * page_size + entry
    if indptr is not None:
        ip, ix = T.int_array(indptr), T.int_array(indices)
        for b in range(len(ip) - 1):
            for slot in range(ip[b], ip[b + 1]):
                if ix[slot] == block:
                    return b, (slot - ip[b]) * page_size + entry
    return None


def assert_cache_equal(actual, expected, *, engine, kv_layout="NHD", cache_dtype=None, layer=0, block_table=None,
                       indptr=None, indices=None, last_page_len=None, page_size=None):
    """Byte equality of two caches of one engine preset, with the first difference named.

    ``actual``/``expected``: one tensor (FlashInfer's [pages, 2, ...], vLLM's
    flash kv_cache, TensorRT-LLM's pool) or a (K, V) pair (vllm-paged,
    flashinfer-tuple, sglang). ``engine`` names the preset (kvsim.engines());
    ``cache_dtype`` what uint8 bytes hold; ``block_table`` (dense, −1 padded)
    or ``indptr``/``indices`` (CSR) map the element back to its request and token;
    ``page_size`` is needed for sglang (its buffers are token-major).
    """
    from . import engine_info, explain

    pairs = list(zip(actual, expected)) if isinstance(actual, (tuple, list)) else [(actual, expected)]
    dtype = cache_dtype_of(pairs[0][0], cache_dtype)
    total = 0
    first = None
    for t, (a, e) in enumerate(pairs):
        ab, eb = _host_bytes(a), _host_bytes(e)
        if ab.shape != eb.shape:
            raise AssertionError(f"cache tensor {t}: shape {ab.shape} != expected {eb.shape}")
        diff = ab != eb
        n = int(diff.sum())
        total += n
        if n and first is None:
            idx = tuple(int(i[0]) for i in np.nonzero(diff))
            first = (t, idx, int(ab[idx]), int(eb[idx]))
    if total == 0:
        return
    t, idx, got, want = first
    shape0 = tuple(pairs[0][0].shape)
    info = _engine_for(engine, kv_layout, dtype, pairs, shape0, page_size)
    tensor = info["tensors"][t]
    kv = tensor["kv"] if tensor["kv"] >= 0 else None
    coords = _coordinates(tensor, idx, kv if kv is not None else 0, info["page_size"])
    coords["layer"] = coords.get("layer", layer) if "layers" in [a[0] for a in tensor["axes"]] else layer
    if dtype == "nvfp4":
        coords["dim"] = coords["dim"] * 2  # the byte holds dims 2i (low nibble) and 2i+1
    where = (f"block {coords['block']}, layer {coords['layer']}, {'KV'[coords['kv']]}, head {coords['head']}, "
             f"entry {coords['entry']}, dim {coords['dim']}")
    lines = [f"{total} element(s) differ; first at {tensor['name']}{list(idx)}: {where}",
             f"  actual   {got:#x} = {_decoded(got, dtype)}",
             f"  expected {want:#x} = {_decoded(want, dtype)}"]
    owner = _token_of(coords["block"], coords["entry"], info["page_size"], block_table, indptr, indices)
    if owner is not None:
        req, token = owner
        lines.append(f"  request {req}, token {token}")
        table = None
        if block_table is not None:
            table = [int(x) for x in T.int_array(block_table).reshape(len(T.int_array(block_table)), -1)[req]]
        try:
            steps = explain(engine=engine, cache_dtype=dtype, kv_layout=kv_layout, layers=info["layers"],
                            kv_heads=info["kv_heads"], page_size=info["page_size"], head_dim=info["head_dim"],
                            blocks=info["blocks"], block_table=table,
                            indptr=None if table is not None else indptr, indices=None if table is not None else indices,
                            last_page_len=None if table is not None else last_page_len,
                            seq=req, token=token, layer=coords["layer"], head=coords["head"], dim=coords["dim"])
            lines.append("  kvsim explain:")
            lines += ["    " + line for line in steps["text"].splitlines()]
        except Exception as ex:  # the table may not describe this element
            lines.append(f"  (explain: {ex})")
    raise AssertionError("\n".join(lines))


def _engine_for(engine, kv_layout, dtype, pairs, shape0, page_size):
    """Geometry of the engine tensors from their shapes (via the preset's axis names)."""
    from . import engine_info

    probe = engine_info(engine, cache_dtype="fp16" if dtype == "nvfp4" else dtype, kv_layout=kv_layout, layers=1,
                        kv_heads=1, page_size=1, head_dim=16, blocks=1)
    names = [a[0] for a in probe["tensors"][0]["axes"]]
    ext = dict(zip(names, shape0))
    if dtype == "nvfp4":
        ext["dim"] *= 2
    vshape = tuple(pairs[-1][0].shape)
    head_dim = ext.get("dim") or vshape[2]
    if "dim/x" in ext:
        head_dim = ext["dim/x"] * ext["x"]
    page = ext.get("tokens", page_size or 1)  # sglang's buffers have no page axis: give page_size
    blocks = ext.get("blocks") or ext["locations"] // page
    info = engine_info(engine, cache_dtype=dtype, kv_layout=kv_layout, layers=ext.get("layers", 1),
                       kv_heads=ext["heads"], page_size=page, head_dim=head_dim, blocks=blocks)
    info.update(page_size=page, kv_heads=ext["heads"], head_dim=head_dim, blocks=blocks, layers=ext.get("layers", 1))
    return info
