"""Attention with the LSE in each engine's convention: FlashInfer's decode and
prefill wrappers (base 2, CSR tables) and vLLM's paged_attention_decode and
flash_attn_varlen_func (natural log, block_table + seq_lens), against a
float64 reference, against each other (decode = a one-query prefill, the
layouts agree, base 2 = natural times fp32 log2 e) byte for byte, the fast
CPU path against core's attend_query (KVSIM_CPU_ATTENTION=reference in a
second process), strided views, dtypes, and bad input raising a named
kvsim.Error with nothing written."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import kvsim

H, HQ, P, D = 2, 4, 4, 32
LOG2E = np.float32(1.44269504088896341)


def csr(lens, pages):
    """FlashInfer CSR table of the requests' lengths over the given page lists."""
    indptr = np.cumsum([0] + [len(p) for p in pages]).astype(np.int32)
    indices = np.array([b for p in pages for b in p], np.int32)
    last = np.array([(n - 1) % P + 1 for n in lens], np.int32)
    return indptr, indices, last


LENS = [7, 9, 1]
PAGES = [[3, 6], [1, 0, 8], [5]]


def filled_cache(device, dtype=torch.bfloat16, layout="NHD", seed=3):
    """A FlashInfer [pages, 2, ...] cache holding every request's K/V (appended by kvsim), and the K/V written."""
    g = torch.Generator().manual_seed(seed)
    n = sum(LENS)
    k = torch.randn(n, H, D, generator=g).to(dtype)
    v = torch.randn(n, H, D, generator=g).to(dtype)
    shape = (9, 2, P, H, D) if layout == "NHD" else (9, 2, H, P, D)
    cache = torch.zeros(shape, dtype=dtype, device=device)
    indptr, indices, last = csr(LENS, PAGES)
    append_indptr = np.cumsum([0] + LENS)
    batch, pos = kvsim.flashinfer.get_batch_indices_positions(append_indptr, np.array(LENS), n)
    kvsim.flashinfer.append_paged_kv_cache(k.to(device), v.to(device), batch, pos, cache, indices, indptr, last,
                                           kv_layout=layout)
    per_request = np.split(np.arange(n), append_indptr[1:-1])
    return cache, k, v, per_request


def reference(q_row, k, v, tokens, sm_scale):
    """float64 attention of one query (all heads) over the given token rows: (out [HQ, D], lse natural [HQ])."""
    out, lse = np.zeros((HQ, D)), np.zeros(HQ)
    for h in range(HQ):
        kh = k[tokens, h // (HQ // H)].double().numpy()
        vh = v[tokens, h // (HQ // H)].double().numpy()
        s = kh @ q_row[h].double().numpy() * sm_scale
        m = s.max()
        e = np.exp(s - m)
        out[h] = e @ vh / e.sum()
        lse[h] = m + math.log(e.sum())
    return out, lse


def decode_wrapper(layout="NHD", **plan):
    indptr, indices, last = csr(LENS, PAGES)
    w = kvsim.flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), layout)
    w.plan(indptr, indices, last, HQ, H, D, P, **plan)
    return w


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_flashinfer_decode_lse_is_base_2_and_close_to_float64(device, layout, q_dtype):
    cache, k, v, rows = filled_cache(device, layout=layout)
    q = torch.randn(3, HQ, D, generator=torch.Generator().manual_seed(9)).to(q_dtype).to(device)
    out, lse = decode_wrapper(layout).run(q, cache, return_lse=True)
    assert out.dtype == q_dtype and lse.dtype == torch.float32 and tuple(lse.shape) == (3, HQ)
    assert out.device == q.device and lse.device == q.device
    for b in range(3):
        ref_out, ref_lse = reference(q[b].cpu(), k, v, rows[b], 1 / math.sqrt(D))
        np.testing.assert_allclose(lse[b].cpu().double().numpy(), ref_lse / math.log(2), rtol=2e-6, atol=2e-6)
        tol = 1e-5 if q_dtype == torch.float32 else 1e-2
        np.testing.assert_allclose(out[b].cpu().double().numpy(), ref_out, rtol=tol, atol=tol)


def test_decode_is_a_one_query_prefill_and_base_2_is_natural_times_log2e(device):
    cache, k, v, rows = filled_cache(device)
    q = torch.randn(3, HQ, D, generator=torch.Generator().manual_seed(4)).to(device)
    out, lse2 = decode_wrapper().run(q, cache, return_lse=True)
    indptr, indices, last = csr(LENS, PAGES)
    pre = kvsim.flashinfer.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    pre.plan(np.arange(4, dtype=np.int32), indptr, indices, last, HQ, H, D, P, causal=True)
    pout, plse2 = pre.run(q, cache, return_lse=True)
    assert torch.equal(out.view(torch.int32), pout.view(torch.int32))
    assert torch.equal(lse2.view(torch.int32), plse2.view(torch.int32))
    # vLLM's flash_attn_varlen_func over the same cache halves: natural log, [heads, total_q].
    table = np.full((3, 3), -1, np.int32)
    for b, p in enumerate(PAGES):
        table[b, :len(p)] = p
    vout, lse_e = kvsim.vllm.flash_attn_varlen_func(q, cache[:, 0], cache[:, 1], 1, np.arange(4, dtype=np.int32),
                                                    9, seqused_k=np.array(LENS, np.int32), causal=True,
                                                    block_table=table, return_softmax_lse=True)
    assert tuple(lse_e.shape) == (HQ, 3)
    assert torch.equal(vout.view(torch.int32), out.view(torch.int32))
    want2 = (lse_e.cpu().numpy().T * LOG2E).astype(np.float32)
    assert np.array_equal(want2.view(np.int32), lse2.cpu().numpy().view(np.int32))


def test_prefill_is_causal_and_each_query_matches_float64(device):
    cache, k, v, rows = filled_cache(device, dtype=torch.float32)
    qo_lens = [3, 9, 1]  # the last 3 / all 9 / the only token of each request are queries
    qo_indptr = np.cumsum([0] + qo_lens).astype(np.int32)
    g = torch.Generator().manual_seed(11)
    fused = torch.randn(qo_indptr[-1], 3 * HQ * D, generator=g).to(device)
    q = fused[:, HQ * D:2 * HQ * D].view(-1, HQ, D)  # a strided slice of a fused QKV
    lse_buf = torch.full((qo_indptr[-1], 2 * HQ), 7.0, device=device)
    lse = lse_buf[:, ::2]  # a strided LSE view, written in place
    indptr, indices, last = csr(LENS, PAGES)
    w = kvsim.flashinfer.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    w.plan(qo_indptr, indptr, indices, last, HQ, H, D, P, causal=True, sm_scale=0.3)
    out, got = w.run(q, cache, lse=lse, return_lse=True)
    assert got is lse and torch.all(lse_buf[:, 1::2] == 7.0)
    for b in range(3):
        for i in range(qo_lens[b]):
            row = qo_indptr[b] + i
            position = LENS[b] - qo_lens[b] + i
            ref_out, ref_lse = reference(q[row].cpu(), k, v, rows[b][:position + 1], 0.3)
            np.testing.assert_allclose(out[row].cpu().double().numpy(), ref_out, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(lse[row].cpu().double().numpy(), ref_lse / math.log(2), rtol=2e-6, atol=2e-6)


def test_vllm_paged_decode_lse_agrees_with_the_flash_layout(device):
    """The split-x cache and the flash cache hold the same tokens: same out and LSE bytes (layout invariance)."""
    x = 8
    key_cache = torch.zeros(9, H, D // x, P, x, dtype=torch.float16, device=device)
    value_cache = torch.zeros(9, H, D, P, dtype=torch.float16, device=device)
    flash = torch.zeros(2, 9, P, H, D, dtype=torch.float16, device=device)
    g = torch.Generator().manual_seed(2)
    k = torch.randn(sum(LENS), H, D, generator=g).half().to(device)
    v = torch.randn(sum(LENS), H, D, generator=g).half().to(device)
    slots = [PAGES[b][t // P] * P + t % P for b in range(3) for t in range(LENS[b])]
    kvsim.vllm.reshape_and_cache(k, v, key_cache, value_cache, slots)
    kvsim.vllm.reshape_and_cache_flash(k, v, flash[0], flash[1], slots)
    table = torch.full((3, 3), -1, dtype=torch.int32)
    for b, p in enumerate(PAGES):
        table[b, :len(p)] = torch.tensor(p)
    q = torch.randn(3, HQ, D, generator=g).half().to(device)
    out, lse = kvsim.vllm.paged_attention_decode(q, key_cache, value_cache, table, LENS, 0.2, return_lse=True)
    assert tuple(lse.shape) == (3, HQ) and lse.dtype == torch.float32
    fout, flse = kvsim.vllm.flash_attn_varlen_func(q, flash[0], flash[1], 1, torch.arange(4, dtype=torch.int32), 9,
                                                   seqused_k=torch.tensor(LENS, dtype=torch.int32),
                                                   softmax_scale=0.2, block_table=table, return_softmax_lse=True)
    assert torch.equal(out.view(torch.int16), fout.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), flse.t().contiguous().view(torch.int32))
    kc, vc = k.cpu().float(), v.cpu().float()
    rows = np.split(np.arange(sum(LENS)), np.cumsum(LENS)[:-1])
    for b in range(3):
        _, ref_lse = reference(q[b].cpu().float(), kc, vc, rows[b], 0.2)
        np.testing.assert_allclose(lse[b].cpu().double().numpy(), ref_lse, rtol=2e-6, atol=2e-6)


def test_fp8_cache_folds_k_scale_into_the_scores():
    """An e4m3 cache: scores = dot(q, code) * (sm_scale * k_scale); lse against float64 over the decoded codes."""
    g = torch.Generator().manual_seed(6)
    n = sum(LENS)
    k = torch.randn(n, H, D, generator=g)
    v = torch.randn(n, H, D, generator=g)
    cache = torch.zeros(9, 2, P, H, D, dtype=torch.uint8)
    indptr, indices, last = csr(LENS, PAGES)
    batch, pos = kvsim.flashinfer.get_batch_indices_positions(np.cumsum([0] + LENS), np.array(LENS), n)
    slots = [PAGES[b][t // P] * P + t % P for b in range(3) for t in range(LENS[b])]
    kvsim.vllm.reshape_and_cache_flash(k, v, cache[:, 0], cache[:, 1], slots, "fp8", 0.5, 0.25)
    q = torch.randn(3, HQ, D, generator=g)
    out, lse = decode_wrapper().run(q, cache, k_scale=0.5, v_scale=0.25, cache_dtype="fp8_e4m3", return_lse=True)
    codes_k = torch.from_numpy(kvsim.codec.decode("e4m3", cache[:, 0].numpy())).float()
    codes_v = torch.from_numpy(kvsim.codec.decode("e4m3", cache[:, 1].numpy())).float()
    kd = torch.stack([codes_k[PAGES[b][t // P], t % P] for b in range(3) for t in range(LENS[b])]) * 0.5
    vd = torch.stack([codes_v[PAGES[b][t // P], t % P] for b in range(3) for t in range(LENS[b])]) * 0.25
    rows = np.split(np.arange(n), np.cumsum(LENS)[:-1])
    for b in range(3):
        ref_out, ref_lse = reference(q[b], kd, vd, rows[b], 1 / math.sqrt(D))
        np.testing.assert_allclose(lse[b].double().numpy(), ref_lse / math.log(2), rtol=2e-6, atol=2e-6)
        np.testing.assert_allclose(out[b].double().numpy(), ref_out, rtol=1e-5, atol=1e-6)


def test_fast_cpu_path_lse_is_attend_querys(tmp_path):
    """The same decode and prefill in a process forced onto core's attend_query give the same out and LSE bytes."""
    script = tmp_path / "lse.py"
    script.write_text(f"""
import sys, numpy as np, torch
sys.path.insert(0, {os.path.dirname(__file__)!r})
import test_attention as t
cache, k, v, rows = t.filled_cache("cpu", dtype=torch.float32)
q = torch.randn(12, t.HQ, t.D, generator=torch.Generator().manual_seed(1))
indptr, indices, last = t.csr(t.LENS, t.PAGES)
w = t.kvsim.flashinfer.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
w.plan(np.array([0, 4, 11, 12], np.int32), indptr, indices, last, t.HQ, t.H, t.D, t.P, causal=True)
out, lse = w.run(q, cache, return_lse=True)
np.save(sys.argv[1], np.concatenate([out.numpy().reshape(-1), lse.numpy().reshape(-1)]).view(np.uint32))
""")
    results = []
    for isa in ("reference", ""):
        env = dict(os.environ, KVSIM_CPU_ATTENTION=isa)
        path = tmp_path / f"out_{isa or 'fast'}.npy"
        r = subprocess.run([sys.executable, str(script), str(path)], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        results.append(np.load(path))
    assert np.array_equal(results[0], results[1])


def test_bad_attention_input_raises_named_errors_and_writes_nothing(device):
    cache, *_ = filled_cache(device)
    q = torch.randn(3, HQ, D, device=device)
    out = torch.full((3, HQ, D), 5.0, device=device)
    lse = torch.full((3, HQ), 5.0, device=device)
    w = decode_wrapper()
    with pytest.raises(kvsim.errors.ShapeMismatch):  # an LSE of the wrong dtype
        w.run(q, cache, out=out, lse=torch.zeros(3, HQ, dtype=torch.float64, device=device), return_lse=True)
    with pytest.raises(kvsim.errors.ShapeMismatch):  # q with other head counts than plan()
        w.run(torch.randn(3, 2, D, device=device), cache)
    indptr, indices, last = csr(LENS, PAGES)
    bad = kvsim.flashinfer.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    bad.plan(indptr + 1, indices, last, HQ, H, D, P)
    with pytest.raises(kvsim.errors.IndptrBadStart):
        bad.run(q, cache, out=out, lse=lse, return_lse=True)
    bad.plan(indptr, np.array([3, 6, 1, 0, 99, 5], np.int32), last, HQ, H, D, P)
    with pytest.raises(kvsim.errors.BlockOutOfRange):
        bad.run(q, cache, out=out, lse=lse, return_lse=True)
    bad.plan(indptr, indices, np.array([3, 5, 1], np.int32), HQ, H, D, P)
    with pytest.raises(kvsim.errors.LastPageLenOutOfRange):
        bad.run(q, cache, out=out, lse=lse, return_lse=True)
    assert torch.all(out == 5.0) and torch.all(lse == 5.0)
    with pytest.raises(kvsim.errors.BadArgument):
        bad.plan(indptr, indices, last, HQ, H, D, P, logits_soft_cap=30.0)
    pre = kvsim.flashinfer.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    with pytest.raises(kvsim.errors.BadArgument):  # kvsim's prefill is causal
        pre.plan(np.array([0, 2, 3, 4], np.int32), indptr, indices, last, HQ, H, D, P, causal=False)
    pre.plan(np.array([0, 8, 9, 10], np.int32), indptr, indices, last, HQ, H, D, P, causal=True)
    with pytest.raises(kvsim.errors.PositionBeyondSequence):  # 8 queries, 7 tokens
        pre.run(torch.randn(10, HQ, D, device=device), cache, return_lse=True)
    with pytest.raises(kvsim.errors.BadArgument):
        kvsim.vllm.flash_attn_varlen_func(q, cache[:, 0], cache[:, 1], 1, [0, 1, 2, 3], 9, seqused_k=LENS,
                                          block_table=np.zeros((3, 3), np.int32), softcap=50.0)


def test_csr_to_dense_gives_each_request_its_own_length():
    """The dense view of a CSR table: one length per request, one row of pages each (-1 past the end). On the
    GPU machine (pybind11 3.1, numpy 2) the lengths once all read back as the first request's."""
    from kvsim import _kvsim
    from kvsim._pools import Bound
    cache = torch.zeros(9, 2, P, H, D, dtype=torch.bfloat16)
    bound = Bound("flashinfer", [cache], "bf16", "nhd", 1, H, P, D)
    lens, table = _kvsim.csr_to_dense(bound.pools, *csr(LENS, PAGES))
    assert lens.tolist() == LENS and lens.strides == (4,)
    assert table.tolist() == [[3, 6, -1], [1, 0, 8], [5, -1, -1]]


def test_cuda_tensors_run_on_the_cuda_backend_with_the_oracles_bytes():
    """A module built with CUDA runs ops on CUDA tensors on its CUDA backend, in place: decode's out and base-2
    LSE equal the CPU oracle's bytes; a host q against a CUDA cache is refused by name, nothing written."""
    if not (torch.cuda.is_available() and kvsim.has_cuda):
        pytest.skip("needs a GPU and a kvsim module built with CUDA")
    q = torch.randn(len(LENS), HQ, D, generator=torch.Generator().manual_seed(5)).bfloat16()
    indptr, indices, last = csr(LENS, PAGES)
    got = {}
    for dev in ("cpu", "cuda"):
        cache = filled_cache(dev)[0]
        w = kvsim.flashinfer.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
        w.plan(indptr, indices, last, HQ, H, D, P)
        out, lse = w.run(q.to(dev), cache, return_lse=True)
        assert out.device.type == dev and lse.device.type == dev
        got[dev] = (out.cpu().view(torch.int16), lse.cpu().view(torch.int32))
    assert torch.equal(got["cpu"][0], got["cuda"][0]) and torch.equal(got["cpu"][1], got["cuda"][1])
    before = cache.clone()
    out = torch.zeros(len(LENS), HQ, D, dtype=torch.bfloat16)
    with pytest.raises(kvsim.errors.BadArgument, match="different devices"):
        w.run(q, cache, out=out)
    assert torch.equal(cache, before) and not out.any()
