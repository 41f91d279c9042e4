"""python/examples: the reference backend passes against kvsim, and each of
the three planted bugs fails with the element named."""

import os
import subprocess
import sys

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def run_pytest(name):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name], cwd=EXAMPLES,
                          capture_output=True, text=True, env=env)


def test_reference_backend_passes():
    r = run_pytest("test_reference_backend.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 passed" in r.stdout


def test_planted_bugs_are_caught_with_the_element_named():
    r = run_pytest("test_planted_bugs.py")
    out = r.stdout
    assert r.returncode == 1 and "3 failed" in out, out + r.stderr
    # past_seq_len off by a chunk: request 0's chunk lands one chunk early
    assert "test_past_seq_len_off_by_a_chunk" in out
    # -1 page: stray bytes in block 0
    assert "first at paged_kv_cache[0, 0, 0, 0, 0]: block 0, layer 0, K, head 0, entry 0, dim 0" in out
    # V tail: V of block 5 at entry 2 (length 6, P 4) is NaN instead of 0
    assert "block 5, layer 0, V, head 0, entry 2, dim 0" in out
    assert out.count("E       AssertionError: ") == 3 and "element(s) differ" in out
    assert out.count("actual   0x") >= 3


def test_torch_attention_passes_and_its_planted_bug_fails_the_report():
    r = run_pytest("test_attention_reference.py")
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    r = run_pytest("test_attention_planted_bug.py")
    out = r.stdout
    assert r.returncode == 1 and "1 failed" in out, out + r.stderr
    assert "attention_report (bf16 output, max_ulp_float64 1, max_ulp_kvsim 2): FAIL" in out
    assert out.count("<-- FAIL") >= 3 * 8 - 1  # (nearly) every (sequence, head) of the 3 x 8 is off
