"""The reference backend with three planted bugs: every test here FAILS, and
its AssertionError names the first wrong element (block, layer, K/V, head,
entry, dim), its request and token, both values and kvsim's explain steps.
Run by python/tests/test_examples.py, which checks exactly that."""

from test_reference_backend import check_append, check_prefill


def test_past_seq_len_off_by_a_chunk():
    check_append(bug="past_off_by_chunk")


def test_minus_one_page_written_to_block_0():
    # request 1's second page is BAD_PAGE (-1): kvsim refuses the write
    # (write_through_bad_page); the buggy backend writes block 0. Compared
    # against a correct run of the valid table, block 0 holds stray bytes.
    import torch
    import numpy as np
    import kvsim
    from reference_backend import torch_append_paged
    from test_reference_backend import paged_case, PAGES, P, H, D
    k, v, seq_lens, append_indptr, indptr, indices, last = paged_case()
    bad = [3, 6, 1, -1]
    with np.testing.assert_raises(kvsim.errors.WriteThroughBadPage):
        batch, pos = kvsim.flashinfer.get_batch_indices_positions(append_indptr, seq_lens, 8)
        kvsim.flashinfer.append_paged_kv_cache(k, v, batch, pos, torch.zeros(PAGES, 2, P, H, D).half(), bad,
                                               indptr, last)
    mine = torch.zeros(PAGES, 2, P, H, D, dtype=torch.float16)
    torch_append_paged(k, v, append_indptr, seq_lens, mine, indptr, bad, P, bug="minus_one_page")
    want = torch.zeros_like(mine)  # the valid part of the write: request 0 and request 1's first page
    batch, pos = kvsim.flashinfer.get_batch_indices_positions([0, 3, 7], [7, 4], 7)
    kvsim.flashinfer.append_paged_kv_cache(k[:7], v[:7], batch, pos, want, [3, 6, 1], [0, 2, 3], [3, 4])
    kvsim.testing.assert_cache_equal(mine, want, engine="flashinfer", indptr=indptr, indices=bad, last_page_len=last)


def test_v_tail_not_zeroed():
    check_prefill(bug="v_tail_not_zeroed")
