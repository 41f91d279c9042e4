"""A PyTorch paged decode (reference_backend.torch_paged_decode) checked
against kvsim's FlashInfer-shaped decode wrapper: outputs with
kvsim.testing.attention_report (another order than kvsim's, so ULP bounds,
not bytes), the base-2 LSE within a few fp32 ULPs of kvsim's. The planted bug
(the query's own key dropped) fails the report: see test_attention_planted_bug.py."""

import math

import numpy as np
import torch

import kvsim
from reference_backend import torch_paged_decode

H, HQ, P, D = 2, 8, 4, 64


def decode_case(seed=7):
    """Three requests (lengths 9, 4, 13) appended by kvsim into a bf16 [pages, 2, P, H, D] cache, and their queries."""
    g = torch.Generator().manual_seed(seed)
    lens, pages = [9, 4, 13], [[4, 0, 7], [2], [1, 5, 3, 6]]
    indptr = np.cumsum([0] + [len(p) for p in pages]).astype(np.int32)
    indices = np.array([x for p in pages for x in p], np.int32)
    last = np.array([(n - 1) % P + 1 for n in lens], np.int32)
    cache = torch.zeros(8, 2, P, H, D, dtype=torch.bfloat16)
    n = sum(lens)
    batch, pos = kvsim.flashinfer.get_batch_indices_positions(np.cumsum([0] + lens), np.array(lens), n)
    k, v = torch.randn(n, H, D, generator=g).bfloat16(), torch.randn(n, H, D, generator=g).bfloat16()
    kvsim.flashinfer.append_paged_kv_cache(k, v, batch, pos, cache, indices, indptr, last)
    q = torch.randn(3, HQ, D, generator=g).bfloat16()
    return q, cache, indptr, indices, last


def check_decode(bug=None):
    q, cache, indptr, indices, last = decode_case()
    sm_scale = 1 / math.sqrt(D)
    out, lse = torch_paged_decode(q, cache, indptr, indices, last, sm_scale, bug=bug)
    kvsim.testing.attention_report(out, q, cache, indptr=indptr, indices=indices, last_page_len=last,
                                   sm_scale=sm_scale, max_ulp_float64=1, max_ulp_kvsim=2).check()
    ref = kvsim.flashinfer.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    ref.plan(indptr, indices, last, HQ, H, D, P)
    _, ref_lse = ref.run(q, cache, return_lse=True)
    np.testing.assert_allclose(lse.numpy(), ref_lse.numpy(), rtol=4e-7, atol=4e-7)


def test_torch_paged_decode_against_kvsim():
    check_decode()
