"""The MLA ops and the secondary pool from Python: append_mla / vLLM's
concat_and_cache_mla / FlashInfer's append_paged_mla_kv_cache against plain
indexing and kvsim's codecs (bytes), nvfp4 latent rows against
kvsim.codec.nvfp4_quantize, mla_attention against a float64 reference and
itself (a chunked prefill is the decode's bytes), FlashInfer's MLA wrapper
against kvsim.LatentPool, offload / onboard moving whole blocks; bad input
named with the caches unchanged."""

import math

import numpy as np
import pytest
import torch

import kvsim

BLOCKS, P, CKV, KPE = 6, 4, 32, 16
HQ = 4


def tokens(n, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, CKV, generator=g).to(dtype), torch.randn(n, KPE, generator=g).to(dtype)


def csr(lens, pages):
    indptr = np.cumsum([0] + [len(p) for p in pages]).astype(np.int32)
    last = np.array([n - (len(p) - 1) * P for n, p in zip(lens, pages)], np.int32)
    return indptr, np.array(sum(pages, []), np.int32), last


LENS, PAGES = [6, 3], [[4, 1], [2]]
SLOTS = [PAGES[b][t // P] * P + t % P for b in range(2) for t in range(LENS[b])]


def bits(x):
    x = x.detach().cpu() if torch.is_tensor(x) else torch.from_numpy(np.asarray(x))
    return x.view(torch.int16 if x.element_size() == 2 else (torch.int32 if x.element_size() == 4 else torch.uint8))


def filled_latent(device="cpu", dtype=torch.bfloat16):
    ckv, kpe = tokens(sum(LENS), 1, dtype)
    cache = torch.zeros(BLOCKS, P, CKV + KPE, dtype=dtype, device=device)
    batch = np.repeat(np.arange(2), LENS).astype(np.int32)
    pos = np.concatenate([np.arange(n) for n in LENS]).astype(np.int32)
    kvsim.LatentPool(cache).append_mla(ckv.to(device), kpe.to(device), batch, pos, *csr(LENS, PAGES))
    return cache, ckv, kpe


def test_append_mla_places_each_row_and_engines_agree(device):
    cache, ckv, kpe = filled_latent(device)
    want = torch.zeros(BLOCKS, P, CKV + KPE, dtype=torch.bfloat16)
    for i, s in enumerate(SLOTS):
        want[s // P, s % P] = torch.cat([ckv[i], kpe[i]])
    assert torch.equal(bits(cache), bits(want))
    # vLLM's slot-mapped form over a strided view (rows of a wider buffer), a -1 slot skipped.
    wide = torch.zeros(BLOCKS, P, CKV + KPE + 8, dtype=torch.bfloat16, device=device)
    kvsim.vllm.concat_and_cache_mla(ckv.to(device), kpe.to(device), wide[..., :CKV + KPE],
                                    torch.tensor(SLOTS[:-1] + [-1]), "auto", 1.0)
    want[SLOTS[-1] // P, SLOTS[-1] % P] = 0
    assert torch.equal(bits(wide[..., :CKV + KPE]), bits(want)) and not wide[..., CKV + KPE:].any()
    # FlashInfer's two caches (ckv_cache, kpe_cache).
    ckv_cache = torch.zeros(BLOCKS, P, CKV, dtype=torch.bfloat16, device=device)
    kpe_cache = torch.zeros(BLOCKS, P, KPE, dtype=torch.bfloat16, device=device)
    batch = np.repeat(np.arange(2), LENS).astype(np.int32)
    pos = np.concatenate([np.arange(n) for n in LENS]).astype(np.int32)
    indptr, indices, last = csr(LENS, PAGES)
    kvsim.flashinfer.append_paged_mla_kv_cache(ckv.to(device), kpe.to(device), batch, pos, ckv_cache, kpe_cache,
                                               indices, indptr, last)
    assert torch.equal(bits(torch.cat([ckv_cache, kpe_cache], -1)), bits(cache))


@pytest.mark.parametrize("fmt,name", [("e4m3", "fp8"), ("e5m2", "fp8_e5m2")])
def test_vllm_fp8_mla_codes_are_the_codecs_of_x_over_scale(fmt, name):
    ckv, kpe = tokens(5, 2, torch.float16)
    cache = torch.zeros(BLOCKS, P, CKV + KPE, dtype=torch.uint8)
    slots = [9, 0, 23, 4, 5]
    kvsim.vllm.concat_and_cache_mla(ckv, kpe, cache, torch.tensor(slots), name, torch.tensor([0.25]))
    x = torch.cat([ckv, kpe], 1).float().numpy()
    want = kvsim.codec.encode(fmt, x / np.float32(0.25))
    for i, s in enumerate(slots):
        assert np.array_equal(cache[s // P, s % P].numpy(), want[i])
    assert int(cache.sum()) == int(sum(int(cache[s // P, s % P].sum()) for s in slots))  # nothing else written


def test_nvfp4_latent_rows_are_the_nvfp4_codec():
    width = CKV + 2 * KPE  # nibbles: nvfp4 ckv, then e4m3 kpe bytes as nibble pairs
    cache = torch.zeros(BLOCKS, P, width // 2, dtype=torch.uint8)
    scales = torch.zeros(BLOCKS, P, width // 16, dtype=torch.uint8)
    pool = kvsim.LatentPool(cache, cache_dtype="nvfp4", scale_cache=scales)
    assert (pool.geometry.head_dim, pool.geometry.kv_heads) == (width, 1)
    ckv, kpe = tokens(3, 4, torch.float32)
    pool.append_mla(ckv, kpe, [0, 0, 0], [0, 1, 2], [0, 1], [3], [3], ckv_global_scale=0.5, kpe_scale=0.125)
    for t in range(3):
        packed, sf = kvsim.codec.nvfp4_quantize(ckv[t].numpy(), 0.5)
        assert np.array_equal(cache[3, t, :CKV // 2].numpy(), packed)
        assert np.array_equal(scales[3, t, :CKV // 16].numpy(), sf)
        assert np.array_equal(cache[3, t, CKV // 2:].numpy(), kvsim.codec.encode("e4m3", kpe[t].numpy() / np.float32(0.125)))
    assert not cache[:3].any() and not cache[4:].any()


def reference(q, latent, seq, position, sm_scale):
    k = latent[:position + 1].astype(np.float64)
    s = k @ q.astype(np.float64) * sm_scale
    e = np.exp(s - s.max())
    return (e @ k[:, :CKV]) / e.sum()


def gathered(cache, b):
    rows = torch.cat([cache[p] for p in PAGES[b]]).float().cpu().numpy()
    return rows[:LENS[b]]


def test_mla_attention_decode_prefill_and_flashinfers_wrapper(device):
    cache, *_ = filled_latent(device, torch.float32)
    table = np.array([[4, 1], [2, -1]], np.int32)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(5, HQ, CKV + KPE, generator=g).to(device)  # rows: seq 0 positions 3..5, seq 1 positions 1..2
    qo = np.array([0, 3, 5], np.int32)
    pool = kvsim.LatentPool(cache)
    out = pool.mla_attention(q, LENS, table, d_ckv=CKV, q_indptr=qo, sm_scale=0.125)
    assert tuple(out.shape) == (5, HQ, CKV) and out.device == q.device
    for row, (b, pos) in enumerate([(0, 3), (0, 4), (0, 5), (1, 1), (1, 2)]):
        for h in range(HQ):
            ref = reference(q[row, h].cpu().numpy(), gathered(cache, b), b, pos, 0.125)
            np.testing.assert_allclose(out[row, h].cpu().double().numpy(), ref, rtol=1e-5, atol=1e-6)
    # Decode of the last rows is the chunk's last rows, bit for bit.
    dec = pool.mla_attention(q[[2, 4]], LENS, table, d_ckv=CKV, sm_scale=0.125)
    assert torch.equal(bits(dec), bits(out[[2, 4]]))
    # FlashInfer's wrapper over (ckv_cache, kpe_cache): the same bytes.
    w = kvsim.flashinfer.BatchMLAPagedAttentionWrapper(None)
    w.plan(qo, np.array([0, 2, 3], np.int32), np.array([4, 1, 2], np.int32), np.array(LENS, np.int32), HQ, CKV, KPE,
           P, True, 0.125, torch.float32, torch.float32)
    fi = w.run(q[..., :CKV].contiguous(), q[..., CKV:].contiguous(), cache[..., :CKV], cache[..., CKV:])
    assert torch.equal(bits(fi), bits(out))
    with pytest.raises(kvsim.errors.BadArgument):
        w.run(q[..., :CKV], q[..., CKV:], cache[..., :CKV], cache[..., CKV:], return_lse=True)


def test_offload_and_onboard_move_whole_blocks(device):
    kv = torch.randn(2, BLOCKS, P, 2, 16, generator=torch.Generator().manual_seed(3)).half().to(device)
    host = torch.zeros(2, 3, P, 2, 16, dtype=torch.float16, device=device)  # vllm-flash layout, 3 secondary blocks
    pools = kvsim.Pools("vllm-flash", kv, kv_heads=2, page_size=P, head_dim=16, secondary=host)
    assert pools.geometry.secondary_blocks == 3
    pools.offload([5, 1], [0, 2])
    assert torch.equal(host[:, 0], kv[:, 5]) and torch.equal(host[:, 2], kv[:, 1]) and not host[:, 1].any()
    before = kv.clone()
    kv.zero_()
    pools.onboard([3, 4], [2, 0])
    assert torch.equal(kv[:, 3], before[:, 1]) and torch.equal(kv[:, 4], before[:, 5])
    assert not kv[:, :3].any() and not kv[:, 5].any()
    latent = torch.zeros(BLOCKS, P, CKV + KPE, dtype=torch.bfloat16)
    latent[2] = 1.5
    spill = torch.zeros(2, P, CKV + KPE, dtype=torch.bfloat16)
    kvsim.LatentPool(latent, secondary=spill).offload([2], [1])
    assert torch.equal(spill[1], latent[2]) and not spill[0].any()


def test_bad_mla_and_move_input_is_named_and_writes_nothing():
    cache, ckv, kpe = filled_latent()
    before = cache.clone()
    pool = kvsim.LatentPool(cache)
    with pytest.raises(kvsim.errors.SlotBeyondPool):
        kvsim.vllm.concat_and_cache_mla(ckv[:2], kpe[:2], cache, torch.tensor([3, BLOCKS * P]), "auto", 1.0)
    with pytest.raises(kvsim.errors.BadArgument):  # two tokens, one slot
        kvsim.vllm.concat_and_cache_mla(ckv[:2], kpe[:2], cache, torch.tensor([5, 5]), "auto", 1.0)
    with pytest.raises(kvsim.errors.ShapeMismatch):  # ckv + kpe != the row
        kvsim.vllm.concat_and_cache_mla(ckv[:2, :8], kpe[:2], cache, torch.tensor([0, 1]), "auto", 1.0)
    with pytest.raises(kvsim.errors.ShapeMismatch):  # fp32 rows into a bf16 cache
        pool.append_mla(ckv[:1].float(), kpe[:1].float(), [0], [0], [0, 1], [0], [1])
    with pytest.raises(kvsim.errors.PositionBeyondSequence):
        pool.append_mla(ckv[:1], kpe[:1], [0], [4], [0, 1], [0], [3])
    with pytest.raises(kvsim.errors.BlockOutOfRange):
        pool.append_mla(ckv[:1], kpe[:1], [0], [0], [0, 1], [BLOCKS], [1])
    q = torch.zeros(2, HQ, CKV + KPE)
    with pytest.raises(kvsim.errors.ShapeMismatch):  # d_ckv does not split the row
        pool.mla_attention(q, LENS, [[4, 1], [2, -1]], d_ckv=CKV + KPE + 1)
    assert torch.equal(bits(cache), bits(before))
    spill = torch.zeros(2, P, CKV + KPE, dtype=torch.bfloat16)
    moving = kvsim.LatentPool(cache, secondary=spill)
    with pytest.raises(kvsim.errors.BlockOutOfRange):
        moving.offload([1], [2])
    with pytest.raises(kvsim.errors.BadArgument):
        moving.onboard([1, 2], [0, 0])
    with pytest.raises(kvsim.errors.ShapeMismatch):
        moving.offload([1, 2], [0])
    with pytest.raises(kvsim.errors.BadArgument):  # the secondary pool inside the primary's memory
        kvsim.LatentPool(cache, secondary=cache[1:3])
    with pytest.raises(kvsim.errors.ShapeMismatch):  # another row width
        kvsim.LatentPool(cache, secondary=torch.zeros(2, P, CKV, dtype=torch.bfloat16))
    assert torch.equal(bits(cache), bits(before)) and not spill.any()
