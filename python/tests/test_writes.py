"""The engine-shaped write functions against references written here with
plain indexing from each engine's documented semantics, on numpy and torch
(CPU, and CUDA where present), with strided views, every cache dtype the op
takes, and bad input raising a named kvsim.Error with the caches unchanged."""

import numpy as np
import pytest
import torch

import kvsim
from conftest import run_cli

H, P, D, PAGES = 2, 4, 16, 9


def fp8_codes_cli(values, fmt="e4m3"):
    """e4m3/e5m2 codes from the kvsim CLI (`kvsim codec encode`), one process for all values."""
    text = "\n".join(repr(float(v)) for v in values) + "\n"
    import subprocess, os
    r = subprocess.run([os.environ.get("KVSIM_BINARY", "kvsim"), "codec", "encode", "--format", fmt], input=text,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.array([int(line.split()[-1], 16) for line in r.stdout.split("\n") if line.strip()], dtype=np.uint8)


def fi_table():
    # two requests: 7 tokens on pages [3, 6] and 2 tokens on page [1]; append 3 + 2 of them
    indptr, indices, last = np.array([0, 2, 3], np.int32), np.array([3, 6, 1], np.int32), np.array([3, 2], np.int32)
    batch, pos = kvsim.flashinfer.get_batch_indices_positions(np.array([0, 3, 5]), np.array([7, 2]), 5)
    return batch, pos, indptr, indices, last


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("tuple_form", [False, True])
def test_flashinfer_append_matches_divmod_reference(device, layout, tuple_form):
    g = torch.Generator().manual_seed(5)
    fused = torch.randn(5, 3 * H * D, generator=g).to(torch.bfloat16).to(device)
    k = fused[:, H * D:2 * H * D].view(5, H, D)  # strided slices of a fused QKV
    v = fused[:, 2 * H * D:].view(5, H, D)
    shape = (PAGES, 2, P, H, D) if layout == "NHD" else (PAGES, 2, H, P, D)
    cache = torch.zeros(shape, dtype=torch.bfloat16, device=device)
    arg = (cache[:, 0], cache[:, 1]) if tuple_form else cache  # FlashInfer's kv[:, 0] views
    batch, pos, indptr, indices, last = fi_table()
    kvsim.flashinfer.append_paged_kv_cache(k, v, batch, pos, arg, indices, indptr, last, kv_layout=layout)
    want = torch.zeros_like(cache)
    for i in range(5):
        b = batch[i]
        page_slot, entry = divmod(indptr[b] * P + pos[i], P)
        page = indices[page_slot]
        for kv, src in ((0, k), (1, v)):
            if layout == "NHD":
                want[page, kv, entry] = src[i]
            else:
                want[page, kv, :, entry] = src[i]
    assert torch.equal(cache.view(torch.int16), want.view(torch.int16))


def test_flashinfer_append_rejects_position_beyond_sequence_unchanged(device):
    k = torch.ones(5, H, D, dtype=torch.float16, device=device)
    cache = torch.full((PAGES, 2, P, H, D), 7.0, dtype=torch.float16, device=device)
    before = cache.clone()
    batch, pos, indptr, indices, last = fi_table()
    pos = pos.copy()
    pos[4] = 2  # request 1 has 2 tokens
    with pytest.raises(kvsim.errors.PositionBeyondSequence):
        kvsim.flashinfer.append_paged_kv_cache(k, k, batch, pos, cache, indices, indptr, last)
    assert torch.equal(cache, before)
    with pytest.raises(kvsim.errors.BlockOutOfRange):
        kvsim.flashinfer.append_paged_kv_cache(k, k, *fi_table()[:2], cache, np.array([3, 6, 99], np.int32),
                                               fi_table()[2], fi_table()[4])
    with pytest.raises(kvsim.errors.ShapeMismatch):
        kvsim.flashinfer.append_paged_kv_cache(k[:, :1], k, *fi_table()[:2], cache, *fi_table()[3:2:-1],
                                               fi_table()[2], fi_table()[4])
    assert torch.equal(cache, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_vllm_flash_auto_copies_bytes_and_skips_minus_one(device, dtype):
    kv_cache = torch.zeros(2, PAGES, P, H, D, dtype=dtype, device=device)
    key_cache, value_cache = kv_cache.unbind(0)
    key = torch.randn(6, H, D).to(dtype).to(device)
    value = torch.randn(6, H, D).to(dtype).to(device)
    slots = torch.tensor([0, 5, -1, 17, 35, 8])
    kvsim.vllm.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, "auto", 1.0, 1.0)
    want = torch.zeros_like(kv_cache)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            want[0, s // P, s % P] = key[i]
            want[1, s // P, s % P] = value[i]
    assert torch.equal(kv_cache, want)


@pytest.mark.parametrize("fmt,name", [("e4m3", "fp8"), ("e4m3", "fp8_e4m3"), ("e5m2", "fp8_e5m2")])
def test_vllm_fp8_codes_are_the_cli_codecs_of_x_over_scale(device, fmt, name):
    key_cache = torch.zeros(PAGES, P, H, D, dtype=torch.uint8, device=device)
    value_cache = torch.zeros_like(key_cache)
    g = torch.Generator().manual_seed(3)
    key = (torch.randn(4, H, D, generator=g) * 300).to(device)
    value = (torch.randn(4, H, D, generator=g) * 3).to(device)
    value[0, 0, 0] = float("nan")
    slots = [2, 9, 30, -1]
    kvsim.vllm.reshape_and_cache_flash(key, value, key_cache, value_cache, torch.tensor(slots), name,
                                       torch.tensor([0.5]), 0.25)
    for i, s in enumerate(slots[:3]):
        k_want = fp8_codes_cli((key[i].cpu().float() / 0.5).flatten().tolist(), fmt)
        v_want = fp8_codes_cli((value[i].cpu().float() / 0.25).flatten().tolist(), fmt)
        assert np.array_equal(key_cache[s // P, s % P].cpu().numpy().reshape(-1), k_want)
        assert np.array_equal(value_cache[s // P, s % P].cpu().numpy().reshape(-1), v_want)


def test_vllm_split_x_reference(device):
    x = 8  # fp16
    key_cache = torch.zeros(PAGES, H, D // x, P, x, dtype=torch.float16, device=device)
    value_cache = torch.zeros(PAGES, H, D, P, dtype=torch.float16, device=device)
    key = torch.randn(3, H, D).half().to(device)
    value = torch.randn(3, H, D).half().to(device)
    slots = [7, 12, 33]
    kvsim.vllm.reshape_and_cache(key, value, key_cache, value_cache, torch.tensor(slots), "auto", 1.0, 1.0)
    for i, s in enumerate(slots):
        b, e = divmod(s, P)
        for h in range(H):
            for d in range(D):
                assert key_cache[b, h, d // x, e, d % x] == key[i, h, d]
                assert value_cache[b, h, d, e] == value[i, h, d]


def test_vllm_value_cache_before_key_cache_is_staged():
    both = torch.zeros(2, PAGES, P, H, D, dtype=torch.float16)
    key = torch.randn(2, H, D).half()
    kvsim.vllm.reshape_and_cache_flash(key, key * 2, both[1], both[0], [3, 4], "auto", 1.0, 1.0)  # V before K
    assert torch.equal(both[1, 0, 3], key[0]) and torch.equal(both[0, 1, 0], key[1] * 2)


def test_vllm_slot_past_the_cache_and_bad_dtype_leave_caches_unchanged():
    key_cache = torch.full((PAGES, P, H, D), 3.0, dtype=torch.float16)
    value_cache = key_cache.clone()
    key = torch.ones(2, H, D, dtype=torch.float16)
    for slots, err in (([0, PAGES * P], kvsim.errors.SlotBeyondPool), ([4, 4], kvsim.errors.BadArgument)):
        before = (key_cache.clone(), value_cache.clone())
        with pytest.raises(kvsim.Error) as info:
            kvsim.vllm.reshape_and_cache_flash(key, key, key_cache, value_cache, slots, "auto", 1.0, 1.0)
        assert isinstance(info.value, kvsim.Error)
        assert torch.equal(key_cache, before[0]) and torch.equal(value_cache, before[1])
    with pytest.raises(kvsim.errors.BadArgument):
        kvsim.vllm.reshape_and_cache_flash(key, key, key_cache, value_cache, [0, 1], "fp4", 1.0, 1.0)
    with pytest.raises(kvsim.errors.ShapeMismatch):
        kvsim.vllm.reshape_and_cache_flash(key, key, key_cache[:, :, :1], value_cache, [0, 1], "auto", 1.0, 1.0)


def test_numpy_arrays_work_in_place():
    key_cache = np.zeros((PAGES, P, H, D), np.float32)
    value_cache = np.zeros_like(key_cache)
    key = np.arange(H * D, dtype=np.float32).reshape(1, H, D)
    kvsim.vllm.reshape_and_cache_flash(key, -key, key_cache, value_cache, np.array([13]), "auto", 1.0, 1.0)
    assert np.array_equal(key_cache[3, 1], key[0]) and np.array_equal(value_cache[3, 1], -key[0])


def test_float8_torch_dtypes_when_present(device):
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("torch without float8 dtypes (Debian's 1.13): covered by the uint8 tests")
    key_cache = torch.zeros(PAGES, P, H, D, dtype=torch.float8_e4m3fn, device=device)
    value_cache = torch.zeros_like(key_cache)
    key = torch.randn(1, H, D, device=device) * 10
    kvsim.vllm.reshape_and_cache_flash(key, key, key_cache, value_cache, [5], "fp8", 1.0, 1.0)
    assert torch.equal(key_cache[1, 1].view(torch.uint8).cpu(), key[0].cpu().to(torch.float8_e4m3fn).view(torch.uint8))
