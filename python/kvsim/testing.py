"""Assertions for engine kernel tests.

``assert_cache_equal(actual, expected, engine=..., ...)`` compares the bytes
of two caches of one engine preset (a tensor, or a (K, V) pair of tensors).
On a mismatch it raises AssertionError naming how many elements differ and
the first one as (block, layer, K/V, head, entry, dim), the token and request
it belongs to when a page table is given, both values raw and decoded, and
kvsim's explain steps for that element.

``attention_report(actual, q, cache, ...)`` is for attention kernels that
cannot be bit-equal to kvsim (another engine's order): per sequence and head,
the ULP distance from a float64 reference and from kvsim's output and the
fraction correctly rounded, with pass/fail against the caller's bounds.
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


# ---------------------------------------------------------------- attention_report
#
# For attention kernels that cannot be bit-equal to kvsim (another engine's
# summation order): how far each output element is from the float64 answer
# and from kvsim's, in units of the output dtype's last place.

_FLOAT_FORMATS = {"fp32": (23, -126, 32), "fp16": (10, -14, 16), "bf16": (7, -126, 16)}  # mantissa bits, emin, width


def _output_dtype(x):
    name = str(x.dtype).replace("torch.", "")
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(name)


def _as_float64(x):
    if T.is_torch(x):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _ulps_from_exact(actual, exact, fmt):
    """|actual - exact| in units of fmt's last place at exact (float64 arrays); NaN mismatches count as inf."""
    p, emin, _ = _FLOAT_FORMATS[fmt]
    with np.errstate(all="ignore"):
        _, e = np.frexp(exact)
        exponent = np.where(exact == 0, emin, np.maximum(e - 1, emin))
        ulp = np.ldexp(1.0, (exponent - p).astype(np.int64))
        err = np.abs(actual - exact) / ulp
    both_nan = np.isnan(actual) & np.isnan(exact)
    same_inf = np.isinf(actual) & (actual == exact)
    err = np.where(both_nan | same_inf, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def _ordered(codes, width):
    """Bit patterns as integers ordered like the floats they encode (-0 and +0 adjacent)."""
    codes = codes.astype(np.int64)
    sign = np.int64(1) << (width - 1)
    return np.where(codes & sign, -(codes & (sign - 1)) - 1, codes)


def _ulps_between(a, b, fmt):
    """Distance in representable values between two arrays of one float dtype (NaN vs non-NaN: inf)."""
    width = _FLOAT_FORMATS[fmt][2]
    ca, cb = _host_bytes(a).astype(np.int64), _host_bytes(b).astype(np.int64)
    d = np.abs(_ordered(ca, width) - _ordered(cb, width)).astype(np.float64)
    na, nb = np.isnan(_as_float64(a)), np.isnan(_as_float64(b))
    d = np.where(na & nb, 0.0, d)
    return np.where(na ^ nb, np.inf, d)


class AttentionReport:
    """Per (sequence, query head): the worst ULP distance of ``actual`` from the float64 reference
    (``max_ulp_float64``) and from kvsim (``max_ulp_kvsim``), and the fraction of its elements that are
    the float64 value correctly rounded to the output dtype (``correctly_rounded``). ``rows`` holds one
    dict per (sequence, head); ``passed`` is False when a bound the caller set is broken; ``str()`` is
    the table; ``check()`` raises AssertionError with it."""

    def __init__(self, rows, bounds, dtype):
        self.rows = rows
        self.bounds = bounds
        self.dtype = dtype
        self.failures = [r for r in rows if not r["passed"]]
        self.passed = not self.failures
        self.max_ulp_float64 = max((r["max_ulp_float64"] for r in rows), default=0.0)
        self.max_ulp_kvsim = max((r["max_ulp_kvsim"] for r in rows), default=0.0)
        self.correctly_rounded = float(np.mean([r["correctly_rounded"] for r in rows])) if rows else 1.0

    def __str__(self):
        b = ", ".join(f"{k} {v}" for k, v in self.bounds.items() if v is not None) or "no bounds"
        head = (f"attention_report ({self.dtype} output, {b}): {'PASS' if self.passed else 'FAIL'}; "
                f"worst {self.max_ulp_float64:.3g} ulp from float64, {self.max_ulp_kvsim:.3g} ulp from kvsim, "
                f"{100 * self.correctly_rounded:.2f}% correctly rounded")
        lines = [head, "  seq head  ulp(f64)  ulp(kvsim)  correctly-rounded  worst element (row, dim)"]
        for r in self.rows:
            lines.append(f"  {r['sequence']:3d} {r['head']:4d}  {r['max_ulp_float64']:8.3g}  {r['max_ulp_kvsim']:10.3g}"
                         f"  {100 * r['correctly_rounded']:16.2f}%  {r['worst']}{'' if r['passed'] else '  <-- FAIL'}")
        return "\n".join(lines)

    def check(self):
        if not self.passed:
            raise AssertionError(str(self))
        return self


def attention_report(actual, q, cache, *, indptr=None, indices=None, last_page_len=None, kv_layout="NHD",
                     block_table=None, seq_lens=None, qo_indptr=None, sm_scale=None, k_scale=1.0, v_scale=1.0,
                     cache_dtype=None, scale_cache=None, k_global_scale=1.0, v_global_scale=1.0, window_left=-1,
                     max_ulp_float64=None, max_ulp_kvsim=None, min_correctly_rounded=None):
    """How close an attention kernel's output is to the float64 answer and to kvsim's, per sequence and head.

    ``actual`` [rows, Hq, D] the kernel's output (fp32/fp16/bf16), ``q`` its
    query [rows, Hq, D], ``cache`` the engine's cache: FlashInfer's
    paged_kv_cache (one [pages, 2, ...] tensor or a (k_cache, v_cache) tuple,
    ``kv_layout``) with the CSR table ``indptr``/``indices``/``last_page_len``,
    or vLLM's (key_cache, value_cache) (flash [blocks, P, H, D] or split-x)
    with ``block_table``/``seq_lens``. ``qo_indptr`` makes it a causal prefill
    (query i of request b at position len_b - qo_len_b + i), else one query per
    request (decode). Scales as in the engines: ``sm_scale`` (default
    1/sqrt(D)), the fp8 per-tensor ``k_scale``/``v_scale``. nvfp4 caches
    (FlashInfer's, ``cache_dtype="nvfp4"``): packed bytes with their block
    scales ``scale_cache`` (one tensor or a (K, V) pair) and the global decode
    scales ``k_global_scale``/``v_global_scale``. ``window_left`` = w >= 0 is a
    sliding window (FlashInfer's window_left, vLLM's window_size[0]): a query
    at position p attends positions max(0, p - w) .. p, in kvsim and in the
    float64 reference.

    The float64 reference reads the cache's K/V through kvsim's gather
    (decoded codes times the scale), computes the scores, softmax and P.V in
    float64; kvsim's output comes from its oracle (the same function as
    kvsim.flashinfer's wrappers). Bounds, each optional:
    ``max_ulp_float64``, ``max_ulp_kvsim`` (ULPs of the output dtype),
    ``min_correctly_rounded`` (fraction in [0, 1], per sequence and head).
    Returns an :class:`AttentionReport`; ``report.check()`` raises with the table.
    """
    import math
    from . import _attention, _kvsim
    from . import flashinfer as fi
    from ._pools import Bound
    from .errors import BadArgument, ShapeMismatch

    fmt = _output_dtype(actual)
    if fmt is None or tuple(actual.shape) != tuple(q.shape) or len(tuple(q.shape)) != 3:
        raise ShapeMismatch(f"shape_mismatch: actual {tuple(actual.shape)} {actual.dtype} must be a float tensor "
                            f"of q's shape {tuple(q.shape)} [rows, Hq, D]")
    if indptr is not None:
        engine, tensors, heads, page, head_dim = fi._cache_shape(cache, kv_layout)
        layout = kv_layout.lower()
    elif block_table is not None and isinstance(cache, (tuple, list)) and len(cache) == 2:
        kshape = tuple(cache[0].shape)
        if len(kshape) == 5:  # vLLM's split-x key_cache [blocks, H, D/x, P, x]
            engine, heads, page, head_dim = "vllm-paged", kshape[1], kshape[3], tuple(cache[1].shape)[2]
        elif len(kshape) == 4:
            engine, heads, page, head_dim = "flashinfer-tuple", kshape[2], kshape[1], kshape[3]
        else:
            raise ShapeMismatch(f"shape_mismatch: key_cache has shape {kshape}")
        tensors, layout = list(cache), "nhd"
    else:
        raise BadArgument("bad_argument: give the CSR table (indptr, indices, last_page_len) with FlashInfer's cache, "
                          "or block_table and seq_lens with vLLM's (key_cache, value_cache)")
    dtype = cache_dtype_of(tensors[0], cache_dtype)
    scales = [] if scale_cache is None else (list(scale_cache) if isinstance(scale_cache, (tuple, list))
                                             else [scale_cache])
    if dtype == "nvfp4":
        if indptr is None:
            raise BadArgument("bad_argument: nvfp4 caches are FlashInfer's: give the CSR table")
        head_dim *= 2  # packed bytes
    window = 0 if window_left is None or window_left < 0 else int(window_left) + 1
    bound = Bound(engine, tensors, dtype, layout, 1, heads, page, head_dim, scales)
    if indptr is not None:
        lens, table = _kvsim.csr_to_dense(bound.pools, T.int_array(indptr), T.int_array(indices),
                                          T.int_array(last_page_len))
    else:
        lens, table = T.int_array(seq_lens), T.int_array(block_table)
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    ks, vs = _attention.scale_value(k_scale), _attention.scale_value(v_scale)
    qi = None if qo_indptr is None else T.int_array(qo_indptr)
    kv_out, _ = _attention.run(bound, q, seq_lens=lens, block_table=table, q_indptr=qi, sm_scale=scale,
                               k_scale=ks, v_scale=vs, k_global_scale=k_global_scale, v_global_scale=v_global_scale,
                               window=window, out=T.empty_like(actual))
    rows_of = ([(b, lens[b] - 1, b) for b in range(len(lens))] if qi is None else
               [(b, lens[b] - (qi[b + 1] - qi[b]) + (i - qi[b]), i) for b in range(len(lens))
                for i in range(qi[b], qi[b + 1])])
    q64, a64 = _as_float64(q), _as_float64(actual)
    ulp_kv = _ulps_between(actual, kv_out, fmt)
    quantized = dtype in ("fp8_e4m3", "fp8_e5m2", "int8")
    # K/V read back through kvsim's gather, from host copies: two cache tensors as one fresh buffer (V right
    # after K), so no output buffer can fall inside the pool's address range (gather's overlap rule).
    def host_copy(ts):
        host = [T.host_copy(t) for t in ts]
        return list(T.stack_pair(*host)) if len(host) == 2 else host
    bound_kv = Bound(engine, host_copy(tensors), dtype, layout, 1, heads, page, head_dim,
                     host_copy(scales))  # read only: never finished
    group = int(q.shape[1]) // heads
    per = {}
    for b in range(len(lens)):
        n = int(lens[b])
        kv = []
        for which, sc, gs in ((0, ks, k_global_scale), (1, vs, v_global_scale)):
            buf = np.zeros((n, heads, head_dim), np.float32)
            _kvsim.gather(bound_kv.pools, 0, which, table[b], n, buf, sc if quantized else 1.0, float(gs))
            kv.append(buf.astype(np.float64) * (1.0 if quantized else sc))
        per[b] = kv
    report_rows = []
    for b in range(len(lens)):
        mine = [(pos, row) for seq, pos, row in rows_of if seq == b]
        k64, v64 = per[b]
        for h in range(int(q.shape[1])):
            errs, kerr, worst = [], [], (0.0, None)
            for pos, row in mine:
                first = 0 if window == 0 else max(0, pos - window + 1)
                s = k64[first:pos + 1, h // group] @ q64[row, h] * scale
                m = s.max()
                e = np.exp(s - m)
                ref = (e @ v64[first:pos + 1, h // group]) / e.sum()
                err = _ulps_from_exact(a64[row, h], ref, fmt)
                errs.append(err)
                kerr.append(ulp_kv[row, h])
                d = int(np.argmax(err))
                if err[d] >= worst[0]:
                    worst = (float(err[d]), (int(row), d))
            if not errs:
                continue
            err, ke = np.concatenate(errs), np.concatenate(kerr)
            r = dict(sequence=b, head=h, max_ulp_float64=float(err.max()), max_ulp_kvsim=float(ke.max()),
                     correctly_rounded=float(np.mean(err <= 0.5)), worst=worst[1])
            r["passed"] = ((max_ulp_float64 is None or r["max_ulp_float64"] <= max_ulp_float64) and
                           (max_ulp_kvsim is None or r["max_ulp_kvsim"] <= max_ulp_kvsim) and
                           (min_correctly_rounded is None or r["correctly_rounded"] >= min_correctly_rounded))
            report_rows.append(r)
    return AttentionReport(report_rows, dict(max_ulp_float64=max_ulp_float64, max_ulp_kvsim=max_ulp_kvsim,
                                             min_correctly_rounded=min_correctly_rounded), fmt)
