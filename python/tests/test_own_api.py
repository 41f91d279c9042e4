"""kvsim's own API: Pools and Geometry from an engine's tensors, gather /
copy_blocks / partial_copy against plain indexing (strided views, dtypes,
CUDA staging), bad input named with the tensors unchanged, and
replay(outputs=True) byte-equal to `kvsim run --dump`."""

import json
import os

import numpy as np
import pytest
import torch

import kvsim
from conftest import run_cli

SOURCE = os.environ.get("KVSIM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BLOCKS, P, H, D = 7, 4, 2, 16


def random_cache(device, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(21)
    return torch.randn(2, BLOCKS, P, H, D, generator=g).to(dtype).to(device)  # vllm-flash's kv_cache, one layer


def test_geometry_from_the_engines_tensors():
    pools = kvsim.Pools("vllm-flash", random_cache("cpu"), kv_heads=H, page_size=P, head_dim=D)
    assert pools.geometry == kvsim.Geometry(layers=1, kv_heads=H, page_size=P, head_dim=D, blocks=BLOCKS,
                                            cache_dtype="bf16", layout="nhd", placement="per_layer")
    trt = torch.zeros(5, 3, 2, H, P, D, dtype=torch.float16)  # TensorRT-LLM [blocks][layers][2][H][P][D]
    g = kvsim.Pools("trtllm", trt, kv_heads=H, page_size=P, head_dim=D, layers=3).geometry
    assert (g.blocks, g.layers, g.layout, g.placement) == (5, 3, "hnd", "in_block")
    with pytest.raises(kvsim.errors.ShapeMismatch):
        kvsim.Pools("vllm-flash", random_cache("cpu")[:, :, :, :1], kv_heads=H, page_size=P, head_dim=D)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gather_reads_the_sequence_rows(device, dtype):
    kv = random_cache(device, dtype)
    pools = kvsim.Pools("flashinfer-tuple", (kv[0], kv[1]), kv_heads=H, page_size=P, head_dim=D)
    table = [5, 2, -1]
    for which in (0, 1):
        got = pools.gather(table, 6, kv=which)
        want = torch.cat([kv[which, 5], kv[which, 2, :2]]).float().cpu().numpy()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.all(pools.gather([-1], 3) == 0)  # a BAD_PAGE reads as zeros


def test_fp8_gather_multiplies_the_decoded_code():
    codes = torch.randint(0, 126, (2, BLOCKS, P, H, D), dtype=torch.uint8)
    pools = kvsim.Pools("vllm-flash", codes, kv_heads=H, page_size=P, head_dim=D, cache_dtype="fp8_e4m3")
    got = pools.gather([3], 4, kv=1, scale=0.5)
    want = kvsim.codec.decode("e4m3", codes[1, 3].numpy()) * np.float32(0.5)
    assert np.array_equal(got, want)


def test_copy_blocks_and_partial_copy_in_place(device):
    fused = torch.zeros(2, BLOCKS, P, H, 2 * D, dtype=torch.float16, device=device)
    fused[..., :D] = random_cache(device, torch.float16)
    kv = fused[..., :D]  # a strided view: rows of 2D, the cache in the first half
    before = kv.clone()
    pools = kvsim.Pools("vllm-flash", kv, kv_heads=H, page_size=P, head_dim=D)
    pools.copy_blocks([1, 4], [6, 0])
    want = before.clone()
    want[:, 6], want[:, 0] = before[:, 1], before[:, 4]
    assert torch.equal(kv.view(torch.int16), want.view(torch.int16))
    assert torch.all(fused[..., D:] == 0)  # the other half of each row untouched
    pools.partial_copy(2, 3, 3)
    want[:, 3, :3] = want[:, 2, :3]
    assert torch.equal(kv.view(torch.int16), want.view(torch.int16))
    snapshot = kv.clone()
    with pytest.raises(kvsim.errors.BlockOutOfRange):
        pools.copy_blocks([1, 99], [2, 3])
    with pytest.raises(kvsim.Error):  # two copies into one block
        pools.copy_blocks([1, 2], [5, 5])
    with pytest.raises(kvsim.Error):  # more tokens than a block holds
        pools.partial_copy(1, 2, P + 1)
    with pytest.raises(kvsim.errors.ShapeMismatch):
        pools.copy_blocks([1, 2], [3])
    assert torch.equal(kv.view(torch.int16), snapshot.view(torch.int16))


def test_replay_outputs_are_the_clis_dump(tmp_path):
    scenario = os.path.join(SOURCE, "scenarios", "quant_fp8_e4m3.toml")
    r = kvsim.replay(scenario, outputs=True)
    assert r["ok"]
    dump = tmp_path / "dump"
    cli = run_cli("run", scenario, "--dump", dump, "--invariants", "none")
    assert cli.returncode == 0, cli.stderr
    manifest = json.load(open(dump / "manifest.json"))["files"]
    assert [e["file"] for e in r["outputs"]] == [e["file"] for e in manifest]
    ops = {e["op"] for e in r["outputs"]}
    assert {"decode_attention", "prefill_attention"} & ops
    for e in r["outputs"]:
        want = np.load(dump / e["file"])
        assert e["array"].dtype == want.dtype and np.array_equal(e["array"].view(np.uint8), want.view(np.uint8)), e["file"]
    assert "outputs" not in kvsim.replay(scenario)
