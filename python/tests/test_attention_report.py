"""kvsim.testing.attention_report: kvsim's own output is 0 ULP from kvsim and
close to float64; a float64 answer rounded once is correctly rounded; a
planted error of k ULPs is measured as k at its (sequence, head, row, dim)
and fails the caller's bound; vLLM's split-x cache and FlashInfer's CSR
table both work; bad input is a named kvsim.Error."""

import math

import numpy as np
import pytest
import torch

import kvsim
from test_attention import H, HQ, D, LENS, PAGES, P, csr, decode_wrapper, filled_cache, reference


def test_kvsims_own_output_is_zero_ulp_from_kvsim(device):
    cache, *_ = filled_cache(device)
    indptr, indices, last = csr(LENS, PAGES)
    table = dict(indptr=indptr, indices=indices, last_page_len=last)
    q = torch.randn(3, HQ, D, generator=torch.Generator().manual_seed(5)).to(device)
    r = kvsim.testing.attention_report(decode_wrapper().run(q.bfloat16(), cache), q.bfloat16(), cache, **table,
                                       max_ulp_kvsim=0, max_ulp_float64=1, min_correctly_rounded=0.95)
    assert r.passed and r.max_ulp_kvsim == 0 and len(r.rows) == 3 * HQ
    r.check()
    # fp32 output: kvsim's fp32 order is not float64 (outputs near zero after cancellation are many ULPs off).
    r = kvsim.testing.attention_report(decode_wrapper().run(q, cache), q, cache, **table, max_ulp_kvsim=0)
    assert r.passed and r.max_ulp_float64 > 0 and r.correctly_rounded < 1.0


def plant(x, row, head, dim, k):
    """x with element (row, head, dim) moved k representable values away from zero."""
    bad = x.clone()
    bits = bad.view(torch.int32 if x.dtype == torch.float32 else torch.int16)
    bits[row, head, dim] += k  # sign-magnitude codes: adding moves away from zero
    return bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_float64_rounded_once_is_correctly_rounded_and_planted_errors_are_counted(dtype):
    cache, k, v, rows = filled_cache("cpu", dtype=torch.float32)
    q = torch.randn(3, HQ, D, generator=torch.Generator().manual_seed(8)).to(dtype)
    exact = torch.stack([torch.from_numpy(reference(q[b].float(), k, v, rows[b], 1 / math.sqrt(D))[0])
                         for b in range(3)])
    actual = exact.float().to(dtype) if dtype != torch.float32 else exact.to(dtype)  # rounded (16-bit: via fp32)
    indptr, indices, last = csr(LENS, PAGES)
    table = dict(indptr=indptr, indices=indices, last_page_len=last)
    r = kvsim.testing.attention_report(actual, q, cache, **table)
    if dtype == torch.float32:
        assert r.correctly_rounded == 1.0 and r.max_ulp_float64 <= 0.5
    else:
        assert r.correctly_rounded >= 0.99 and r.max_ulp_float64 <= 0.5 + 2 ** -14
    rep = kvsim.testing.attention_report(plant(actual, 1, 2, 7, 5), q, cache, **table, max_ulp_float64=2)
    row = [x for x in rep.rows if (x["sequence"], x["head"]) == (1, 2)][0]
    assert 4.5 <= row["max_ulp_float64"] <= 5.5 and row["worst"] == (1, 7) and not row["passed"]
    assert not rep.passed and len(rep.failures) == 1
    with pytest.raises(AssertionError, match="FAIL"):
        rep.check()
    kv_out = decode_wrapper().run(q, cache)
    rep = kvsim.testing.attention_report(plant(kv_out, 1, 2, 7, 5), q, cache, **table, max_ulp_kvsim=2)
    row = [x for x in rep.rows if (x["sequence"], x["head"]) == (1, 2)][0]
    assert row["max_ulp_kvsim"] == 5 and not rep.passed and len(rep.failures) == 1
    assert all(x["max_ulp_kvsim"] == 0 for x in rep.rows if x is not row)


def test_vllm_split_x_cache_and_prefill_rows():
    x = 8
    key_cache = torch.zeros(9, H, D // x, P, x, dtype=torch.float16)
    value_cache = torch.zeros(9, H, D, P, dtype=torch.float16)
    g = torch.Generator().manual_seed(12)
    k = torch.randn(sum(LENS), H, D, generator=g).half()
    v = torch.randn(sum(LENS), H, D, generator=g).half()
    slots = [PAGES[b][t // P] * P + t % P for b in range(3) for t in range(LENS[b])]
    kvsim.vllm.reshape_and_cache(k, v, key_cache, value_cache, slots)
    table = np.full((3, 3), -1, np.int32)
    for b, p in enumerate(PAGES):
        table[b, :len(p)] = p
    qo = np.array([0, 2, 4, 5], np.int32)  # two queries, two queries, one query
    q = torch.randn(5, HQ, D, generator=g).half()
    flash = torch.zeros(2, 9, P, H, D, dtype=torch.float16)
    kvsim.vllm.reshape_and_cache_flash(k, v, flash[0], flash[1], slots)
    out = kvsim.vllm.flash_attn_varlen_func(q, flash[0], flash[1], 2, qo, 9, seqused_k=np.array(LENS, np.int32),
                                            causal=True, block_table=table, softmax_scale=0.25)
    r = kvsim.testing.attention_report(out, q, (key_cache, value_cache), block_table=table, seq_lens=LENS,
                                       qo_indptr=qo, sm_scale=0.25, max_ulp_kvsim=0, max_ulp_float64=1)
    assert r.passed, str(r)
    assert "seq head" in str(r) and "PASS" in str(r)


def test_bad_report_input_is_named():
    cache, *_ = filled_cache("cpu")
    q = torch.randn(3, HQ, D)
    indptr, indices, last = csr(LENS, PAGES)
    with pytest.raises(kvsim.errors.ShapeMismatch):
        kvsim.testing.attention_report(torch.zeros(3, HQ, D + 1), q, cache, indptr=indptr, indices=indices,
                                       last_page_len=last)
    with pytest.raises(kvsim.errors.BadArgument):
        kvsim.testing.attention_report(torch.zeros(3, HQ, D), q, cache)
    with pytest.raises(kvsim.errors.BlockOutOfRange):
        kvsim.testing.attention_report(torch.zeros(3, HQ, D), q, cache, indptr=indptr, indices=indices + 50,
                                       last_page_len=last)


def test_nvfp4_cache_reads_through_its_block_and_global_scales():
    g = torch.Generator().manual_seed(31)
    n = sum(LENS)
    k, v = torch.randn(n, H, D, generator=g), torch.randn(n, H, D, generator=g)
    cache = torch.zeros(9, 2, P, H, D // 2, dtype=torch.uint8)
    scales = torch.zeros(9, 2, P, H, D // 16, dtype=torch.uint8)
    indptr, indices, last = csr(LENS, PAGES)
    batch, pos = kvsim.flashinfer.get_batch_indices_positions(np.cumsum([0] + LENS), np.array(LENS), n)
    gs = dict(k_global_scale=0.5, v_global_scale=0.25)
    kvsim.flashinfer.append_paged_kv_cache(k, v, batch, pos, cache, indices, indptr, last, cache_dtype="nvfp4",
                                           scale_cache=scales, **gs)
    q = torch.randn(3, HQ, D, generator=g).bfloat16()
    table = dict(indptr=indptr, indices=indices, last_page_len=last, cache_dtype="nvfp4", scale_cache=scales, **gs)
    out = decode_wrapper().run(q, cache, cache_dtype="nvfp4", scale_cache=scales, **gs)
    r = kvsim.testing.attention_report(out, q, cache, **table, max_ulp_kvsim=0, max_ulp_float64=1)
    assert r.passed, str(r)
    # The reference reads the decoded nibbles: with the wrong global scale kvsim's own output is far off.
    wrong = kvsim.testing.attention_report(out, q, cache, **dict(table, v_global_scale=0.5), max_ulp_float64=1)
    assert not wrong.passed and wrong.max_ulp_kvsim > 1


def test_a_sliding_window_is_applied_to_both_references(device):
    cache, *_ = filled_cache(device)
    indptr, indices, last = csr(LENS, PAGES)
    table = dict(indptr=indptr, indices=indices, last_page_len=last)
    q = torch.randn(3, HQ, D, generator=torch.Generator().manual_seed(6)).bfloat16().to(device)
    out = decode_wrapper(window_left=3).run(q, cache)  # the last 4 positions
    r = kvsim.testing.attention_report(out, q, cache, **table, window_left=3, max_ulp_kvsim=0, max_ulp_float64=1)
    assert r.passed, str(r)
    full = kvsim.testing.attention_report(out, q, cache, **table, max_ulp_float64=1)
    # Sequence 2 has one token (the window changes nothing there); the longer two are far off without it.
    assert {x["sequence"] for x in full.failures} == {0, 1}
