#!/usr/bin/env python3
"""PyTorch baseline for kvsim's benchmarks (issue 8, SPEC §8).

The same configurations as `kvsim bench`, done the way a framework's reference
backend does them, with no custom kernel:
  * writes (append_paged / reshape_and_cache): `index_copy_` of K and V rows into
    the paged pool viewed as [blocks * P, H, D] (NHD) -- for an fp8 cache the
    rows are first divided by the scale and cast to float8_e4m3fn;
  * decode: gather each sequence's pages into a contiguous [B, H, ctx, D] tensor
    through its block table, then `scaled_dot_product_attention` with GQA
    (an fp8 cache is dequantized to bf16 after the gather).

Each row: median time over many launches measured with CUDA events after
warm-up (wall clock on the CPU), the minimal bytes the op must move (the same
definition kvsim bench uses: K/V bytes read or written plus Q/out for decode),
achieved GB/s, and the ratio to a device-to-device copy measured in the same
run (bytes read + written). JSON on stdout with --json, else a table.

  python3 bench/pytorch_baseline.py [--device cuda|cpu] [--quick] [--full] [--json]
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def timed(fn, device, warmup=3, min_iters=10, min_seconds=0.3):
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        start_all = time.perf_counter()
        while len(times) < min_iters or time.perf_counter() - start_all < min_seconds:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e-3)
            if len(times) >= 200:
                break
    else:
        start_all = time.perf_counter()
        while len(times) < min(min_iters, 5) or time.perf_counter() - start_all < min_seconds:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if len(times) >= 50:
                break
    return statistics.median(times)


def copy_bandwidth(device):
    n = (1 << 30) if device == "cuda" else (1 << 27)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), device)
    return 2 * n / t / 1e9


def random_block_table(batch, pages_per_seq, total_blocks, device, gen):
    perm = torch.randperm(total_blocks, generator=gen)[: batch * pages_per_seq]
    return perm.view(batch, pages_per_seq).to(device)


def bench_write(device, tokens, H, D, P, cache, copy_gbs, gen):
    blocks = (tokens + P - 1) // P + 8
    pool_dtype = torch.float8_e4m3fn if cache == "fp8_e4m3" else torch.bfloat16
    k_pool = torch.zeros(blocks * P, H, D, dtype=pool_dtype, device=device)
    v_pool = torch.zeros_like(k_pool)
    k = torch.randn(tokens, H, D, dtype=torch.bfloat16, device=device, generator=None)
    v = torch.randn_like(k)
    slots = torch.randperm(blocks * P, generator=gen)[:tokens].to(device)
    scale = 0.5

    # index_copy_ has no float8 kernel: fp8 rows travel as their bytes.
    k_bytes, v_bytes = k_pool.view(torch.uint8), v_pool.view(torch.uint8)

    def run():
        if cache == "fp8_e4m3":
            k_bytes.index_copy_(0, slots, (k.float() / scale).to(pool_dtype).view(torch.uint8))
            v_bytes.index_copy_(0, slots, (v.float() / scale).to(pool_dtype).view(torch.uint8))
        else:
            k_pool.index_copy_(0, slots, k)
            v_pool.index_copy_(0, slots, v)

    t = timed(run, device)
    elem = 1 if cache == "fp8_e4m3" else 2
    moved = 2 * tokens * H * D * (2 + elem)  # read bf16 K/V, write the cache
    gbs = moved / t / 1e9
    return dict(op="write(index_copy_)", cache=cache, tokens=tokens, kv_heads=H, head_dim=D, page=P,
                seconds=t, bytes=moved, gbs=gbs, copy_ratio=gbs / copy_gbs)


def bench_decode(device, batch, ctx, Hq, H, D, P, cache, copy_gbs, gen):
    pages = (ctx + P - 1) // P
    total_blocks = batch * pages + 16
    pool_dtype = torch.float8_e4m3fn if cache == "fp8_e4m3" else torch.bfloat16
    k_pool = torch.randn(total_blocks, P, H, D, device=device).to(pool_dtype)
    v_pool = torch.randn(total_blocks, P, H, D, device=device).to(pool_dtype)
    table = random_block_table(batch, pages, total_blocks, device, gen)
    q = torch.randn(batch, Hq, 1, D, dtype=torch.bfloat16, device=device)
    sm_scale = 1.0 / math.sqrt(D)

    def run():
        k = k_pool[table].reshape(batch, pages * P, H, D)[:, :ctx]
        v = v_pool[table].reshape(batch, pages * P, H, D)[:, :ctx]
        if cache == "fp8_e4m3":
            k = k.to(torch.bfloat16)
            v = v.to(torch.bfloat16)
        k = k.transpose(1, 2)
        v = v.transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v, scale=sm_scale, enable_gqa=True)

    t = timed(run, device)
    elem = 1 if cache == "fp8_e4m3" else 2
    moved = 2 * batch * ctx * H * D * elem + 2 * batch * Hq * D * 2
    gbs = moved / t / 1e9
    return dict(op="decode(gather+sdpa)", cache=cache, batch=batch, context=ctx, q_heads=Hq, kv_heads=H,
                head_dim=D, page=P, seconds=t, bytes=moved, gbs=gbs, copy_ratio=gbs / copy_gbs)


def fits(device, nbytes):
    if device != "cuda":
        return nbytes < 8e9
    free, _ = torch.cuda.mem_get_info()
    return nbytes * 3 < free  # pool + gathered copy + headroom


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="a few small rows (smoke run)")
    ap.add_argument("--full", action="store_true", help="also GQA 64:8 and page 64 (four times the rows)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    device = args.device
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    copy_gbs = copy_bandwidth(device)
    rows = []
    D, H = 128, 8
    write_tokens = [4096] if args.quick or device == "cpu" else [16384, 65536]
    for cache in ("bf16", "fp8_e4m3"):
        for tokens in write_tokens:
            rows.append(bench_write(device, tokens, H, D, 16, cache, copy_gbs, gen))
    if args.quick or device == "cpu":
        decode_cfgs = [(1, 1024), (16, 1024), (4, 8192)]
    else:
        decode_cfgs = [(b, c) for b in (1, 16, 64, 256) for c in (1024, 8192, 32768)]
    for Hq in ((32, 64) if args.full else (32,)):
        for P in ((16, 64) if args.full else (16,)):
            for cache in ("bf16", "fp8_e4m3"):
                for batch, ctx in decode_cfgs:
                    need = 2 * batch * ctx * H * D * (1 if cache == "fp8_e4m3" else 2)
                    if not fits(device, need):
                        continue
                    rows.append(bench_decode(device, batch, ctx, Hq, H, D, P, cache, copy_gbs, gen))
                    if device == "cuda":
                        torch.cuda.empty_cache()
    report = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                  torch=torch.__version__, threads=torch.get_num_threads(), copy_gbs=copy_gbs, rows=rows)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
        return
    print(f"# PyTorch {torch.__version__} baseline on {report['device']}; copy bandwidth {copy_gbs:.0f} GB/s")
    for r in rows:
        shape = (f"tokens {r['tokens']}" if "tokens" in r else
                 f"B {r['batch']} ctx {r['context']} GQA {r['q_heads']}:{r['kv_heads']}")
        print(f"{r['op']:22s} {r['cache']:9s} P {r['page']:3d} {shape:28s} "
              f"{r['seconds'] * 1e6:10.1f} us {r['gbs']:8.1f} GB/s {100 * r['copy_ratio']:5.1f}% of copy")


if __name__ == "__main__":
    main()
