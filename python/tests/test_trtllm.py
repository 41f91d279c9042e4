"""kvsim.trtllm.qkv_preprocess (TensorRT-LLM's applyBiasRopeUpdateKVCache over
its [blocks][layers][2][H][P][D] pool) against references written here with
plain indexing: bias in fp32, the fp8 codes of the kvsim CLI, RoPE against
float64, the V tail zeroed and K left alone, chunked context equal to one
chunk byte for byte, strided inputs, CUDA staging, and bad input raising a
named kvsim.Error with the pool unchanged."""

import numpy as np
import pytest
import torch

import kvsim
from test_writes import fp8_codes_cli

BLOCKS, LAYERS, H, HQ, P, D = 6, 2, 2, 4, 4, 16
WIDTH = (HQ + 2 * H) * D
TABLE = np.array([[2, 4], [1, 5]], np.int32)


def pool(device, dtype=torch.bfloat16, fill=float("nan")):
    return torch.full((BLOCKS, LAYERS, 2, H, P, D), fill, dtype=dtype, device=device)


def inputs(n, seed=1, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, WIDTH, generator=g).to(dtype), torch.randn(WIDTH, generator=g).to(dtype)


def expected_pool(before, kv_rows, seq_lens, cache_lens, layer, zero_tail=True):
    """The pool after writing each sequence's new K/V rows (kv_rows [n, 2, H, D], fp32) and zeroing V tails."""
    want = before.clone()
    row = 0
    for b, (n, total) in enumerate(zip(seq_lens, cache_lens)):
        for t in range(n):
            pos = total - n + t
            block, entry = TABLE[b][pos // P], pos % P
            want[block, layer, :, :, entry] = kv_rows[row].to(want.dtype)
            row += 1
        if zero_tail and n > 0:
            last = total - 1
            want[TABLE[b][last // P], layer, 1, :, last % P + 1:] = 0
    return want


def test_bias_write_and_v_tail_bytes(device):
    qkv, bias = inputs(8)
    before = pool(device)
    cache = before.clone()
    q_out = torch.empty(8, HQ, D, dtype=torch.bfloat16, device=device)
    wide = torch.zeros(8, WIDTH + 32, dtype=torch.bfloat16, device=device)
    wide[:, 16:16 + WIDTH] = qkv.to(device)
    strided = wide[:, 16:16 + WIDTH]  # a strided view of the fused input
    kvsim.trtllm.qkv_preprocess(strided, q_out, cache, layer=1, seq_lens=[5, 3], cache_seq_lens=[5, 7],
                                block_table=TABLE, head_num=HQ, qkv_bias=bias.to(device))
    x = (qkv.float() + bias.float())  # one fp32 add, then rounded once to the cache dtype
    kv_rows = x[:, HQ * D:].view(8, 2, H, D)
    want = expected_pool(before.cpu(), kv_rows, [5, 3], [5, 7], layer=1)
    assert torch.equal(cache.cpu().view(torch.int16), want.view(torch.int16))
    assert torch.equal(q_out.cpu().view(torch.int16), x[:, :HQ * D].view(8, HQ, D).bfloat16().view(torch.int16))
    assert torch.isnan(cache[:, 0].float()).all()  # layer 0 untouched


def test_fp8_pool_codes_are_the_clis():
    qkv, _ = inputs(8, seed=2, dtype=torch.float32)
    cache = torch.zeros(BLOCKS, LAYERS, 2, H, P, D, dtype=torch.uint8)
    q_out = torch.empty(8, HQ, D)
    kvsim.trtllm.qkv_preprocess(qkv, q_out, cache, layer=0, seq_lens=[5, 3], cache_seq_lens=[5, 7],
                                block_table=TABLE, head_num=HQ, cache_dtype="fp8_e4m3", kv_scale_orig_quant=2.0)
    kv = qkv[:, HQ * D:].reshape(-1).numpy() * np.float32(2.0)
    codes = torch.from_numpy(fp8_codes_cli(kv).reshape(8, 2, H, D).astype(np.int16))
    want = expected_pool(torch.zeros(cache.shape, dtype=torch.int16), codes, [5, 3], [5, 7], layer=0)
    assert torch.equal(cache.to(torch.int16), want)


@pytest.mark.parametrize("style", ["rope_gpt_neox", "rope_gptj"])
def test_rope_against_float64_and_chunking_is_byte_exact(device, style):
    qkv, _ = inputs(5, seed=3, dtype=torch.float32)
    args = dict(layer=0, block_table=TABLE[:1], head_num=HQ, position_embedding_type=style, rotary_embedding_dim=D,
                rotary_embedding_base=10000.0, rotary_embedding_max_positions=16)
    one = pool(device, torch.float32, 0.0)
    q_one = torch.empty(5, HQ, D, device=device)
    kvsim.trtllm.qkv_preprocess(qkv.to(device), q_one, one, seq_lens=[5], cache_seq_lens=[5], **args)
    two = pool(device, torch.float32, 0.0)
    q_two = torch.empty(5, HQ, D, device=device)
    kvsim.trtllm.qkv_preprocess(qkv[:2].to(device), q_two[:2], two, seq_lens=[2], cache_seq_lens=[2], **args)
    kvsim.trtllm.qkv_preprocess(qkv[2:].to(device), q_two[2:], two, seq_lens=[3], cache_seq_lens=[5], **args)
    assert torch.equal(one.view(torch.int32), two.view(torch.int32))
    assert torch.equal(q_one.view(torch.int32), q_two.view(torch.int32))
    # float64 rotation: pairs (i, i + D/2) for NeoX, (2i, 2i + 1) for GPT-J.
    inv = 10000.0 ** (-np.arange(0, D, 2) / D)
    for t in range(5):
        k = qkv[t, HQ * D:(HQ + H) * D].view(H, D).double().numpy()
        c, s = np.cos(t * inv), np.sin(t * inv)
        if style == "rope_gpt_neox":
            a, b = k[:, :D // 2], k[:, D // 2:]
            rot = np.concatenate([a * c - b * s, b * c + a * s], axis=1)
        else:
            a, b = k[:, 0::2], k[:, 1::2]
            rot = np.empty_like(k)
            rot[:, 0::2], rot[:, 1::2] = a * c - b * s, b * c + a * s
        got = one[TABLE[0][t // P], 0, 0, :, t % P].cpu().double().numpy()
        np.testing.assert_allclose(got, rot, rtol=1e-5, atol=1e-6)


def test_bad_input_is_named_and_the_pool_unchanged(device):
    qkv, _ = inputs(8)
    cache = pool(device, fill=1.0)
    before = cache.clone()
    q_out = torch.empty(8, HQ, D, dtype=torch.bfloat16, device=device)
    kw = dict(layer=0, seq_lens=[5, 3], cache_seq_lens=[5, 7], head_num=HQ)
    with pytest.raises(kvsim.errors.BlockOutOfRange):
        kvsim.trtllm.qkv_preprocess(qkv.to(device), q_out, cache, block_table=[[2, 4], [1, 99]], **kw)
    with pytest.raises(kvsim.errors.WriteThroughBadPage):
        kvsim.trtllm.qkv_preprocess(qkv.to(device), q_out, cache, block_table=[[2, -1], [1, 5]], **kw)
    with pytest.raises(kvsim.errors.ShapeMismatch):  # qkv of the wrong width
        kvsim.trtllm.qkv_preprocess(qkv[:, :-D].to(device), q_out, cache, block_table=TABLE, **kw)
    with pytest.raises(kvsim.errors.ShapeMismatch):  # a pool of the wrong rank
        kvsim.trtllm.qkv_preprocess(qkv.to(device), q_out, cache[:, 0], block_table=TABLE, **kw)
    with pytest.raises(kvsim.errors.BadArgument):
        kvsim.trtllm.qkv_preprocess(qkv.to(device), q_out, cache, block_table=TABLE, position_embedding_type="alibi",
                                    **kw)
    with pytest.raises(kvsim.Error):  # layer past the pool's layers
        kvsim.trtllm.qkv_preprocess(qkv.to(device), q_out, cache, block_table=TABLE, **dict(kw, layer=2))
    assert torch.equal(cache.view(torch.int16), before.view(torch.int16))


def test_indexer_k_cache_scatter_against_flat_indexing(device):
    blocks, bs, hd = 3, 4, 16
    g = torch.Generator().manual_seed(4)
    k = torch.randint(0, 255, (5, hd), generator=g, dtype=torch.uint8)
    scale = torch.rand(5, 1, generator=g)  # one fp32 per token: TensorRT-LLM passes 4-byte elements
    cache = torch.full((blocks, bs, 1, hd + 4), 0xAA, dtype=torch.uint8, device=device)
    row = hd + 4
    slots = [5, 0, -1, 11, 6]  # token 2 skipped
    fp8 = [s * row if s >= 0 else -1 for s in slots]
    sc = [s * row + hd if s >= 0 else -1 for s in slots]
    kvsim.trtllm.indexer_k_cache_scatter_op(k.to(device), scale.to(device), cache, fp8, sc)
    want = torch.full((blocks * bs * row,), 0xAA, dtype=torch.uint8)
    for t, s in enumerate(slots):
        if s >= 0:
            want[s * row:s * row + hd] = k[t]
            want[s * row + hd:s * row + hd + 4] = scale[t].view(torch.uint8)
    assert torch.equal(cache.cpu().reshape(-1), want)
    before = cache.clone()
    with pytest.raises(kvsim.errors.SlotBeyondPool):
        kvsim.trtllm.indexer_k_cache_scatter_op(k.to(device), scale.to(device), cache, [0, row, 2 * row, 99 * row, 0],
                                                sc)
    with pytest.raises(kvsim.errors.BadArgument):  # tokens 0 and 4 would write the same bytes
        kvsim.trtllm.indexer_k_cache_scatter_op(k.to(device), scale.to(device), cache, [1, row, -1, 3 * row, 0], sc)
    assert torch.equal(cache, before)
