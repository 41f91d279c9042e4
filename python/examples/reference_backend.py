"""A PyTorch reference backend's KV writes, the way engines' Python reference
paths write them (plain tensor indexing), with switches that plant three
classic bugs. The example tests check these against kvsim.

* ``torch_append_paged``: FlashInfer-style paged append into a
  [pages, 2, P, H, D] cache from (batch_indices, positions) and a CSR table.
  Bug ``past_off_by_chunk``: the position is computed from the sequence length
  before the chunk instead of after it (past_seq_len off by one chunk).
  Bug ``minus_one_page``: a token whose table entry is −1 (BAD_PAGE) is
  written to page −1 + ... = block 0 instead of being refused.
* ``torch_reshape_and_cache_fp8``: vLLM-style fp8 write (uint8 cache,
  ``(x / scale).to(float8)``), rounded through kvsim's codec because Debian's
  torch 1.13 has no float8 dtype.
* ``torch_prefill_write``: a TensorRT-LLM-style context write that must zero
  the V rows of the sequence's last block beyond its length. Bug
  ``v_tail_not_zeroed`` leaves them as they were (NaN from the allocator).
"""

import torch

import kvsim


def torch_append_paged(k, v, append_indptr, seq_lens, kv_cache, indptr, indices, page_size, bug=None):
    for b in range(len(seq_lens)):
        n = append_indptr[b + 1] - append_indptr[b]
        past = seq_lens[b] - n
        if bug == "past_off_by_chunk":
            past = seq_lens[b] - 2 * n if seq_lens[b] >= 2 * n else 0
        for j in range(n):
            i = append_indptr[b] + j
            pos = past + j
            page = indices[indptr[b] + pos // page_size]
            if page < 0 and bug != "minus_one_page":
                raise ValueError("write through BAD_PAGE")
            page = max(page, 0)  # the bug: -1 clamps to block 0
            kv_cache[page, 0, pos % page_size] = k[i]
            kv_cache[page, 1, pos % page_size] = v[i]


def torch_reshape_and_cache_fp8(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale):
    P = key_cache.shape[1]
    for i, slot in enumerate(slot_mapping):
        if slot < 0:
            continue
        b, e = divmod(slot, P)
        key_cache[b, e] = torch.from_numpy(kvsim.codec.encode("e4m3", (key[i] / k_scale).numpy()))
        value_cache[b, e] = torch.from_numpy(kvsim.codec.encode("e4m3", (value[i] / v_scale).numpy()))


def torch_prefill_write(k, v, key_cache, value_cache, block_table, length, bug=None):
    """Context write of one sequence's `length` tokens into [blocks, P, H, D] caches, zeroing V's tail."""
    P = key_cache.shape[1]
    for t in range(length):
        b, e = block_table[t // P], t % P
        key_cache[b, e] = k[t]
        value_cache[b, e] = v[t]
    if bug != "v_tail_not_zeroed" and length % P:
        value_cache[block_table[(length - 1) // P], length % P:] = 0


def torch_paged_decode(q, kv_cache, indptr, indices, last_page_len, sm_scale, bug=None):
    """FlashInfer-style paged decode the way a reference path computes it: gather each request's pages of
    a [pages, 2, P, H, D] cache, scores and softmax in fp32 with torch, out in q's dtype, lse in base 2.
    Bug ``drops_last_key``: the kv length is taken one short (the query's own key is never attended)."""
    import math
    page_size, heads = kv_cache.shape[2], kv_cache.shape[3]
    group = q.shape[1] // heads
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32)
    for b in range(q.shape[0]):
        pages = [int(p) for p in indices[indptr[b]:indptr[b + 1]]]
        length = (len(pages) - 1) * page_size + int(last_page_len[b])
        if bug == "drops_last_key":
            length -= 1
        k = kv_cache[pages, 0].reshape(-1, heads, kv_cache.shape[4])[:length].float()
        v = kv_cache[pages, 1].reshape(-1, heads, kv_cache.shape[4])[:length].float()
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * sm_scale
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v).to(q.dtype)
        lse[b] = torch.logsumexp(scores, dim=-1) / math.log(2)
    return out, lse
