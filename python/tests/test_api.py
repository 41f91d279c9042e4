"""kvsim's own API: explain() is the CLI's explain, codecs agree with the CLI,
replay() runs a built-in scenario, assert_cache_equal names the element, and
decode attention over the split-x cache agrees with a float64 reference."""

import os

import numpy as np
import pytest
import torch

import kvsim
from conftest import run_cli

SOURCE = os.environ.get("KVSIM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.parametrize("args,kw", [
    (["--block-table", "4,9,2,7", "--token", "37", "--head", "3", "--dim", "70"],
     dict(block_table=[4, 9, 2, 7], token=37, head=3, dim=70)),
    (["--indptr", "0,3,5", "--indices", "4,9,2,7,1", "--last-page-len", "5,9", "--seq", "1", "--token", "20",
      "--dtype", "nvfp4", "--layout", "hnd"],
     dict(indptr=[0, 3, 5], indices=[4, 9, 2, 7, 1], last_page_len=[5, 9], seq=1, token=20, cache_dtype="nvfp4",
          kv_layout="HND")),
    (["--engine", "vllm-paged", "--dtype", "fp8_e4m3", "--block-table", "3,1", "--token", "17", "--dim", "33"],
     dict(engine="vllm-paged", cache_dtype="fp8_e4m3", block_table=[3, 1], token=17, dim=33)),
    (["--layers", "3", "--layer-windows", "8,8,0", "--layer", "1", "--null-block", "0", "--page-size", "4",
      "--blocks", "12", "--block-table", "0,0,7,9", "--token", "13"],
     dict(layers=3, layer_windows=[8, 8, 0], layer=1, null_block=0, page_size=4, blocks=12, block_table=[0, 0, 7, 9],
          token=13)),
])
def test_explain_text_is_the_cli_output(args, kw):
    r = run_cli("explain", *args)
    assert r.returncode == 0, r.stderr
    e = kvsim.explain(**kw)
    assert e["text"] == r.stdout
    assert [s["key"] for s in e["steps"]][:5] == ["window", "page", "table", "element", "byte"]


def test_explain_per_layer_windows_and_null_entries():
    e = kvsim.explain(layers=3, layer_windows=[8, 8, 0], layer=1, null_block=0, page_size=4, blocks=12,
                      block_table=[0, 0, 7, 9], token=13)
    assert e["window"] == 8 and e["null_entries"] == [0, 1] and e["block"] == 9
    with pytest.raises(kvsim.errors.BadWindow):  # token 5 is on a released page
        kvsim.explain(layers=3, layer_windows=[8, 8, 0], layer=1, null_block=0, page_size=4, blocks=12,
                      block_table=[0, 0, 7, 9], token=5)


def test_explain_errors_are_named():
    with pytest.raises(kvsim.errors.WriteThroughBadPage):
        kvsim.explain(block_table=[4, -1], token=20)
    with pytest.raises(kvsim.errors.PositionBeyondSequence):
        kvsim.explain(block_table=[4], token=16)


def test_codecs_agree_with_the_cli():
    values = np.array([448, 464, 480, 1, -1.5, 0, -0.0, np.nan, 2 ** -9, 2 ** -10], np.float32)
    r = run_cli("codec", "encode", "--format", "e4m3", *[repr(float(v)) for v in values])
    assert r.returncode == 0, r.stderr
    cli = [int(line.split()[-1], 16) for line in r.stdout.splitlines()]
    assert kvsim.codec.encode("e4m3", values).tolist() == cli
    assert kvsim.codec.encode("e2m1", [6, 7, -0.5, 0.25, 0.75, 5]).tolist() == [7, 7, 9, 0, 2, 6]
    assert kvsim.codec.encode("bf16", [1.0, -2.0]).tolist() == [0x3F80, 0xC000]
    assert kvsim.codec.decode("e4m3", kvsim.codec.encode("e4m3", [1.5, -448])).tolist() == [1.5, -448]
    packed, scales = kvsim.codec.nvfp4_quantize(np.arange(16, dtype=np.float32), 1.0)
    assert packed.shape == (8,) and scales.shape == (1,)
    # Each of the 8 bytes is its own element (pybind11 3.1's array_t(count) gave arrays whose every
    # element read back as the first: docs/python.md).
    assert packed.strides == (1,) and len(set(packed.tolist())) > 4


def test_replay_runs_a_builtin_scenario():
    r = kvsim.replay(os.path.join(SOURCE, "scenarios", "quant_fp8_e4m3.toml"))
    assert r["ok"] and r["counters"]["steps"] > 0
    assert r["invariants"]["conservation"][0] == "pass"
    assert "fail" not in [status for status, _ in r["invariants"].values()]


def test_assert_cache_equal_names_the_first_element():
    kv_cache = torch.zeros(2, 6, 4, 2, 16, dtype=torch.float16)
    expected = kv_cache.clone()
    kv_cache[1, 3, 2, 1, 9] = 1.5  # V of block 3, entry 2, head 1, dim 9
    kv_cache[0, 5, 0, 0, 0] = 2.0
    with pytest.raises(AssertionError) as info:
        kvsim.testing.assert_cache_equal((kv_cache[0], kv_cache[1]), (expected[0], expected[1]),
                                         engine="flashinfer-tuple", block_table=[[5, 3]])
    text = str(info.value)
    assert "2 element(s) differ" in text
    assert "block 5, layer 0, K, head 0, entry 0, dim 0" in text  # K is compared first
    assert "request 0, token 0" in text and "kvsim explain:" in text
    kvsim.testing.assert_cache_equal(expected, expected.clone(), engine="vllm-flash")


def test_decode_attention_split_x_against_float64():
    x, blocks, P, H, D = 8, 6, 4, 2, 16
    key_cache = torch.zeros(blocks, H, D // x, P, x, dtype=torch.float16)
    value_cache = torch.zeros(blocks, H, D, P, dtype=torch.float16)
    g = torch.Generator().manual_seed(1)
    k = torch.randn(7, H, D, generator=g).half()
    v = torch.randn(7, H, D, generator=g).half()
    table = [[2, 5]]
    slots = [table[0][t // P] * P + t % P for t in range(7)]
    kvsim.vllm.reshape_and_cache(k, v, key_cache, value_cache, slots, "auto", 1.0, 1.0)
    q = torch.randn(1, 4, D, generator=g).float()
    out = kvsim.vllm.paged_attention_decode(q, key_cache, value_cache, table, [7], 0.25)
    for h in range(4):
        kv_head = h // 2
        s = (q[0, h].double() @ k[:, kv_head].double().T) * 0.25
        p = torch.softmax(s, 0)
        ref = p @ v[:, kv_head].double()
        assert torch.allclose(out[0, h].double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("engine", kvsim.engines())
def test_scenario_cache_engine_replays_with_the_engines_strides(tmp_path, engine):
    """cache.engine: the replay's pools get the engine's strides; outputs equal the other layouts (layout invariant)."""
    text = open(os.path.join(SOURCE, "scenarios", "flashinfer_shared_kv_allocation.toml")).read()
    text = text.replace("shared_kv_allocation = true", f'engine = "{engine}"')
    text = text.replace('placement = "per_layer"\n', "").replace('layout = "nhd"\n', "")
    path = tmp_path / f"engine_{engine}.toml"
    path.write_text(text)
    r = kvsim.replay(path)
    assert r["ok"], r
    assert r["invariants"]["layout"][0] == "pass"
    bad = text.replace(f'engine = "{engine}"', 'engine = "vllm"')
    path.write_text(bad)
    with pytest.raises(kvsim.errors.BadScenario):
        kvsim.replay(path)


def test_segv_backtrace_handler_prints_the_native_stack_and_chains():
    """KVSIM_SEGV_BACKTRACE=1: a crash prints the native frames, then Python's faulthandler its stack."""
    import subprocess
    import sys
    code = "import kvsim, ctypes; ctypes.string_at(0)"
    env = dict(os.environ, KVSIM_SEGV_BACKTRACE="1", PYTHONFAULTHANDLER="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == -11, (r.returncode, r.stderr)
    assert "kvsim: fatal signal, native backtrace (KVSIM_SEGV_BACKTRACE)" in r.stderr
    assert "Fatal Python error: Segmentation fault" in r.stderr  # faulthandler ran after ours
    assert "kvsim: faulting pc 0x" in r.stderr and "kvsim: fault address 0x0" in r.stderr, r.stderr
    assert "kvsim: stack word (return address?) 0x" in r.stderr
    env.pop("KVSIM_SEGV_BACKTRACE")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == -11 and "native backtrace" not in r.stderr


def test_a_crash_inside_a_pytest_test_prints_the_native_stack(tmp_path):
    """ctest runs the suite with --capture=sys: pytest's default fd capture would send the native stack into
    its temporary capture file, lost with the process (what happened on the GPU machine)."""
    import subprocess
    import sys
    (tmp_path / "test_crash.py").write_text("import ctypes, kvsim\n\ndef test_crash():\n    ctypes.string_at(0)\n")
    env = dict(os.environ, KVSIM_SEGV_BACKTRACE="1", PYTHONFAULTHANDLER="1")
    shown = {}
    for capture in ("sys", "fd"):
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--capture={capture}",
                            str(tmp_path / "test_crash.py")], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == -11 and "Fatal Python error: Segmentation fault" in r.stderr, r.stderr
        shown[capture] = "native backtrace (KVSIM_SEGV_BACKTRACE)" in r.stderr
    assert shown == {"sys": True, "fd": False}
