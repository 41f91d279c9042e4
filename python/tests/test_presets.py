"""Engine tensor presets (core/engine_presets.hpp) against offsets computed by
numpy from each engine's own tensor shape, as the engine's source writes it;
nothing here calls kvsim's offset arithmetic. kvsim's side is
`kvsim explain --engine NAME --json` (k/v_tensor_offset: the element's offset
inside the engine's tensor) and kvsim.explain()."""

import json

import numpy as np
import pytest

import kvsim
from conftest import run_cli

L, H, P, D, B = 3, 4, 8, 32, 10


def engine_offset(engine, dtype_bytes, layer, kv, block, head, entry, dim, kv_layout="NHD"):
    """(tensor name, element offset) from the engine's shapes, numpy row-major."""
    def at(shape, index):
        return int(np.ravel_multi_index(index, shape))

    if engine == "vllm-flash":  # FlashAttentionBackend.get_kv_cache_shape, per layer
        return "kv_cache", at((2, B, P, H, D), (kv, block, entry, head, dim))
    if engine == "vllm-flash-cross-layer":
        return "kv_cache", at((B, L, 2, P, H, D), (block, layer, kv, entry, head, dim))
    if engine == "vllm-paged":  # PagedAttention.split_kv_cache
        x = 16 // dtype_bytes
        if kv == 0:
            return "key_cache", at((B, H, D // x, P, x), (block, head, dim // x, entry, dim % x))
        return "value_cache", at((B, H, D, P), (block, head, dim, entry))
    if engine == "flashinfer":
        if kv_layout == "NHD":
            return "paged_kv_cache", at((B, 2, P, H, D), (block, kv, entry, head, dim))
        return "paged_kv_cache", at((B, 2, H, P, D), (block, kv, head, entry, dim))
    if engine == "flashinfer-tuple":
        name = ("k_cache", "v_cache")[kv]
        if kv_layout == "NHD":
            return name, at((B, P, H, D), (block, entry, head, dim))
        return name, at((B, H, P, D), (block, head, entry, dim))
    if engine == "trtllm":  # pool [blocks, layers, 2, H, P, D] (KVBlockArray::getKVLocalIdx)
        return "pool", at((B, L, 2, H, P, D), (block, layer, kv, head, entry, dim))
    if engine == "sglang":  # MHATokenToKVPool k_buffer/v_buffer [locations, H, D]
        return ("k_buffer", "v_buffer")[kv], at((B * P, H, D), (block * P + entry, head, dim))
    raise AssertionError(engine)


CASES = [(e, lay) for e in kvsim.engines() for lay in (("NHD", "HND") if e.startswith("flashinfer") else ("NHD",))]


@pytest.mark.parametrize("engine,kv_layout", CASES)
@pytest.mark.parametrize("dtype,size", [("fp16", 2), ("fp8_e4m3", 1), ("fp32", 4)])
def test_preset_offsets_match_the_engines_shapes(engine, kv_layout, dtype, size):
    rng = np.random.default_rng(len(engine) * 7 + size)
    table = [int(b) for b in rng.permutation(B)[:4]]
    for _ in range(12):
        token = int(rng.integers(0, 4 * P))
        layer, head, dim = int(rng.integers(0, L)), int(rng.integers(0, H)), int(rng.integers(0, D))
        e = kvsim.explain(token=token, block_table=table, engine=engine, cache_dtype=dtype, kv_layout=kv_layout,
                          layers=L, kv_heads=H, page_size=P, head_dim=D, blocks=B, layer=layer, head=head, dim=dim)
        block, entry = table[token // P], token % P
        for t in e["tensors"]:
            name, offset = engine_offset(engine, size, layer, t["kv"], block, head, entry, dim, kv_layout)
            assert t["tensor"].startswith(name)
            assert t["tensor_offset"] == offset, (engine, t)
            assert t["tensor_byte_offset"] == offset * size


@pytest.mark.parametrize("engine", ["vllm-paged", "sglang", "flashinfer", "trtllm"])
def test_cli_explain_engine_json_agrees(engine):
    r = run_cli("explain", "--engine", engine, "--json", "--dtype", "fp16", "--layers", L, "--kv-heads", H,
                "--page-size", P, "--head-dim", D, "--blocks", B, "--block-table", "7,2,5", "--token", 13,
                "--layer", 2, "--head", 3, "--dim", 21)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    for kv, key in ((0, "k"), (1, "v")):
        name, offset = engine_offset(engine, 2, 2, kv, 2, 3, 5, 21)
        assert j[key + "_tensor"].startswith(name)
        assert j[key + "_tensor_offset"] == offset


def test_vllm_paged_v_is_its_own_tensor():
    """The newcomer's report: V lives in value_cache, not next to K in one block."""
    r = run_cli("explain", "--engine", "vllm-paged", "--dtype", "fp16", "--kv-heads", 2, "--head-dim", 16,
                "--page-size", 4, "--blocks", 8, "--block-table", "3,5", "--token", 6, "--head", 1, "--dim", 9)
    assert r.returncode == 0, r.stderr
    assert "V in value_cache[layer 0] = " in r.stdout
    v_offset = int(np.ravel_multi_index((5, 1, 9, 2), (8, 2, 16, 4)))  # value_cache[block 5, head 1, dim 9, entry 2]
    assert r.stdout.rstrip().splitlines()[-1].endswith(f"= {v_offset} * 16 / 8 = {v_offset * 2}")


def test_engine_rejects_what_it_cannot_hold():
    with pytest.raises(kvsim.errors.BadGeometry):
        kvsim.engine_info("vllm-paged", cache_dtype="nvfp4")
    with pytest.raises(kvsim.errors.BadGeometry):
        kvsim.engine_info("flashinfer", kv_layout="split-x")
    r = run_cli("layout", "--engine", "vllm-paged", "--dtype", "nvfp4")
    assert r.returncode == 2 and "bad_geometry" in r.stderr and r.stdout == ""
