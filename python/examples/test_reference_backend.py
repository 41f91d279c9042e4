"""kvsim as the reference of a PyTorch backend's KV writes: all pass.
(test_planted_bugs.py is the same with three bugs planted; each fails naming
the element.)"""

import numpy as np
import torch

import kvsim
from reference_backend import torch_append_paged, torch_prefill_write, torch_reshape_and_cache_fp8

H, P, D, PAGES = 2, 4, 16, 8


def paged_case():
    g = torch.Generator().manual_seed(11)
    seq_lens, append_indptr = [7, 5], [0, 3, 8]  # request 0 appends a chunk of 3, request 1 prefills 5
    indptr, indices = [0, 2, 4], [3, 6, 1, 5]
    last = [seq_lens[0] - P, seq_lens[1] - P]
    k = torch.randn(8, H, D, generator=g).half()
    v = torch.randn(8, H, D, generator=g).half()
    return k, v, seq_lens, append_indptr, indptr, indices, last


def check_append(bug=None, indices=None):
    k, v, seq_lens, append_indptr, indptr, default_indices, last = paged_case()
    indices = indices or default_indices
    mine = torch.zeros(PAGES, 2, P, H, D, dtype=torch.float16)
    torch_append_paged(k, v, append_indptr, seq_lens, mine, indptr, indices, P, bug=bug)
    want = torch.zeros_like(mine)
    batch, pos = kvsim.flashinfer.get_batch_indices_positions(append_indptr, seq_lens, 8)
    kvsim.flashinfer.append_paged_kv_cache(k, v, batch, pos, want, np.array(indices, np.int32),
                                           np.array(indptr, np.int32), np.array(last, np.int32))
    kvsim.testing.assert_cache_equal(mine, want, engine="flashinfer", indptr=indptr, indices=indices,
                                     last_page_len=last)


def check_fp8_reshape():
    g = torch.Generator().manual_seed(2)
    key, value = torch.randn(6, H, D, generator=g) * 100, torch.randn(6, H, D, generator=g)
    slots = [4, 9, -1, 30, 0, 17]
    mine = (torch.zeros(PAGES, P, H, D, dtype=torch.uint8), torch.zeros(PAGES, P, H, D, dtype=torch.uint8))
    torch_reshape_and_cache_fp8(key, value, *mine, slots, 0.5, 0.02)
    want = (torch.zeros_like(mine[0]), torch.zeros_like(mine[1]))
    kvsim.vllm.reshape_and_cache_flash(key, value, *want, torch.tensor(slots), "fp8", 0.5, 0.02)
    kvsim.testing.assert_cache_equal(mine, want, engine="flashinfer-tuple", cache_dtype="fp8_e4m3")


def check_prefill(bug=None):
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(6, H, D, generator=g).half(), torch.randn(6, H, D, generator=g).half()
    table = [2, 5]
    mine = (torch.zeros(PAGES, P, H, D, dtype=torch.float16), torch.full((PAGES, P, H, D), float("nan")).half())
    torch_prefill_write(k, v, *mine, table, 6, bug=bug)
    # kvsim: the write (reshape_and_cache_flash) plus the zeroed tail of the last block
    want = (torch.zeros_like(mine[0]), torch.full_like(mine[1], float("nan")))
    slots = [table[t // P] * P + t % P for t in range(6)]
    tail = [table[1] * P + e for e in range(6 % P, P)]
    kvsim.vllm.reshape_and_cache_flash(k, v, *want, torch.tensor(slots), "auto", 1.0, 1.0)
    zeros = torch.zeros(len(tail), H, D, dtype=torch.float16)
    kvsim.vllm.reshape_and_cache_flash(zeros, zeros, torch.empty_like(want[0]), want[1], torch.tensor(tail), "auto",
                                       1.0, 1.0)
    kvsim.testing.assert_cache_equal(mine, want, engine="flashinfer-tuple", block_table=[table])


def test_paged_append():
    check_append()


def test_fp8_reshape_and_cache():
    check_fp8_reshape()


def test_prefill_write_zeroes_the_v_tail():
    check_prefill()
