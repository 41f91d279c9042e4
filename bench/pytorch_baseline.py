#!/usr/bin/env python3
"""PyTorch baseline for kvsim's benchmarks (issue 8, contract §8).

Measures the configurations `kvsim bench` lists, done the way a framework's
reference backend does them, with no custom kernel:
  * append_paged / reshape_and_cache: the K and V rows are written into the
    paged pool by index (index_copy_ for NHD, an index_put_ for HND and split-x
    viewed as HND); an fp8 cache first divides by the scale and casts to
    float8_e4m3fn (written as bytes);
  * qkv_preprocess_write: split the fused QKV, NeoX RoPE on Q and K from the
    cos/sin table, Q copied out, K and V written as above;
  * gather_paged: index the pool by the block table, transpose to
    [tokens, H, D] and convert to fp32 (fp8: times the scale);
  * decode_attention: gather each sequence's pages through its block table
    into a contiguous tensor, then scaled_dot_product_attention with GQA (an
    fp8 cache is dequantized to bf16 after the gather);
  * prefill_attention: gather the sequence, then causal SDPA;
  * copy_blocks / partial_copy: index_copy_ of whole blocks / slice copies.
nvfp4 caches have no PyTorch dtype: those rows are skipped with a reason.

Each row: median time over many launches measured with CUDA events after
warm-up (wall clock on the CPU), the same minimal bytes kvsim counts, GB/s,
and the ratio to a device-to-device copy measured in the same run (bytes
read + written). Rows carry the kvsim configuration name ("case"), which
`kvsim bench --baseline FILE` joins on to print kvsim's speed-up.

  kvsim bench --backend cuda --list --json > cases.json
  python3 bench/pytorch_baseline.py --cases cases.json --json > torch.json
  kvsim bench --backend cuda --baseline torch.json
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
        while len(times) < 3 or time.perf_counter() - start_all < min_seconds:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if len(times) >= 50:
                break
    return statistics.median(times)


def copy_bandwidth(device):
    n = (1 << 30) if device == "cuda" else (1 << 28)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), device)
    return 2 * n / t / 1e9


class Skip(Exception):
    pass


def cache_dtype(name):
    if name == "bf16":
        return torch.bfloat16
    if name == "fp8_e4m3":
        return torch.float8_e4m3fn
    raise Skip(f"no PyTorch dtype for a {name} cache")


def free_bytes(device):
    if device != "cuda":
        return 32e9
    free, _ = torch.cuda.mem_get_info()
    return free


def need(device, nbytes):
    if nbytes > free_bytes(device) * 0.9:
        raise Skip(f"needs {nbytes / 2**30:.1f} GiB")


class Pool:
    """One layer's K and V pools, [blocks, P, H, D] (nhd) or [blocks, H, P, D] (hnd)."""

    def __init__(self, p, blocks, device, fill=False):
        self.dtype = cache_dtype(p["cache"])
        self.layout = p.get("layout", "hnd")
        self.P, self.H, self.D = p["page"], p["kv_heads"], p["head_dim"]
        shape = (blocks, self.P, self.H, self.D) if self.layout == "nhd" else (blocks, self.H, self.P, self.D)
        need(device, 2 * blocks * self.P * self.H * self.D * self.dtype.itemsize * 2)
        if fill:  # no fp32 temporary (a 32 GB pool would need 64 GB more)
            self.k, self.v = self.random(shape, device), self.random(shape, device)
        else:
            self.k = torch.zeros(shape, dtype=self.dtype, device=device)
            self.v = torch.zeros_like(self.k)

    def random(self, shape, device):
        if self.dtype == torch.float8_e4m3fn:  # finite codes only (0x7F is NaN)
            return torch.randint(0, 0x7E, shape, dtype=torch.uint8, device=device).view(self.dtype)
        return torch.empty(shape, dtype=self.dtype, device=device).uniform_(-1, 1)

    def write(self, slots, k, v, scale=0.125):
        """Rows k, v [T, H, D] (bf16) into cache slots (block * P + entry)."""
        if self.dtype == torch.float8_e4m3fn:
            k = (k.float() / scale).to(self.dtype).view(torch.uint8)
            v = (v.float() / scale).to(self.dtype).view(torch.uint8)
            kp, vp = self.k.view(torch.uint8), self.v.view(torch.uint8)
        else:
            kp, vp = self.k, self.v
        if self.layout == "nhd":
            kp.view(-1, self.H, self.D).index_copy_(0, slots, k)
            vp.view(-1, self.H, self.D).index_copy_(0, slots, v)
        else:
            blk, off = slots // self.P, slots % self.P
            kp[blk, :, off] = k
            vp[blk, :, off] = v

    def gather_batch(self, pool, table, tokens):
        """[B, tokens, H, D] through a [B, pages] table."""
        g = pool[table]
        if self.layout != "nhd":
            g = g.transpose(2, 3)
        return g.reshape(table.shape[0], -1, self.H, self.D)[:, :tokens]

    def gather(self, pool, table, tokens):
        """[tokens, H, D] of one sequence's table."""
        g = pool[table]
        if self.layout != "nhd":
            g = g.transpose(1, 2)
        return g.reshape(-1, self.H, self.D)[:tokens]


def random_slots(sequences, tokens, page, blocks, device, gen):
    pages = (tokens + page - 1) // page
    table = torch.randperm(blocks, generator=gen)[: sequences * pages].view(sequences, pages)
    t = torch.arange(tokens)
    slots = (table[:, t // page] * page + t % page).reshape(-1)
    return table.to(device), slots.to(device)


def bench_case(case, device, gen):
    op, p = case["op"], case["params"]
    if op in ("append_paged", "reshape_and_cache"):
        B, T = p["sequences"], p["tokens"]
        blocks = B * ((T + p["page"] - 1) // p["page"]) + 8
        pool = Pool(p, blocks, device)
        _, slots = random_slots(B, T, p["page"], blocks, device, gen)
        k = torch.randn(B * T, p["kv_heads"], p["head_dim"], device=device).to(torch.bfloat16)
        v = torch.randn_like(k)
        return timed(lambda: pool.write(slots, k, v), device)
    if op == "qkv_preprocess_write":
        B, T, Hq, H, D = p["sequences"], p["tokens"], p["q_heads"], p["kv_heads"], p["head_dim"]
        blocks = B * ((T + p["page"] - 1) // p["page"]) + 8
        pool = Pool(p, blocks, device)
        _, slots = random_slots(B, T, p["page"], blocks, device, gen)
        qkv = torch.randn(B * T, (Hq + 2 * H) * D, device=device).to(torch.bfloat16)
        pos = torch.arange(T, device=device).repeat(B)
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=device).float() / D))
        ang = torch.arange(T, device=device).float()[:, None] * inv[None, :]
        cos, sin = ang.cos()[pos][:, None, :], ang.sin()[pos][:, None, :]
        q_out = torch.empty(B * T, Hq, D, dtype=torch.bfloat16, device=device)

        def rope(x):
            x = x.float()
            a, b = x[..., : D // 2], x[..., D // 2:]
            return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1).to(torch.bfloat16)

        def run():
            q, k, v = qkv.view(B * T, Hq + 2 * H, D).split((Hq, H, H), dim=1)
            q_out.copy_(rope(q))
            pool.write(slots, rope(k), v.contiguous())

        return timed(run, device)
    if op == "gather_paged":
        T = p["tokens"]
        blocks = (T + p["page"] - 1) // p["page"] + 8
        pool = Pool(p, blocks, device, fill=True)
        table, _ = random_slots(1, T, p["page"], blocks, device, gen)
        table = table[0]
        return timed(lambda: pool.gather(pool.k, table, T).float() * 0.125, device)
    if op == "decode_attention":
        B, ctx, Hq, D = p["batch"], p["context"], p["q_heads"], p["head_dim"]
        blocks = B * ((ctx + p["page"] - 1) // p["page"]) + 8
        pool = Pool(p, blocks, device, fill=True)
        need(device, 6 * B * ctx * p["kv_heads"] * D * 2)  # gathered K/V, bf16 copies, SDPA's contiguous inputs
        table, _ = random_slots(B, ctx, p["page"], blocks, device, gen)
        q = torch.randn(B, Hq, 1, D, device=device).to(torch.bfloat16)

        def run():
            k, v = pool.gather_batch(pool.k, table, ctx), pool.gather_batch(pool.v, table, ctx)
            if pool.dtype != torch.bfloat16:
                k, v = k.to(torch.bfloat16) * 0.125, v.to(torch.bfloat16) * 0.125
            return F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), scale=1 / math.sqrt(D),
                                                  enable_gqa=True)

        return timed(run, device)
    if op == "prefill_attention":
        T, Hq, D = p["tokens"], p["q_heads"], p["head_dim"]
        blocks = (T + p["page"] - 1) // p["page"] + 8
        pool = Pool(p, blocks, device, fill=True)
        table, _ = random_slots(1, T, p["page"], blocks, device, gen)
        q = torch.randn(1, Hq, T, D, device=device).to(torch.bfloat16)

        def run():
            k = pool.gather(pool.k, table[0], T).transpose(0, 1)[None]
            v = pool.gather(pool.v, table[0], T).transpose(0, 1)[None]
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(D), enable_gqa=True)

        return timed(run, device)
    if op in ("copy_blocks", "partial_copy"):
        n = p["pairs"]
        pool = Pool(p, 2 * n, device, fill=True)
        src = torch.arange(n, device=device)
        dst = src + n
        if op == "copy_blocks":
            def run():
                pool.k.index_copy_(0, dst, pool.k[src])
                pool.v.index_copy_(0, dst, pool.v[src])
        else:
            t = p["tokens"]

            def run():
                for i in range(n):
                    pool.k[n + i, :, :t] = pool.k[i, :, :t]
                    pool.v[n + i, :, :t] = pool.v[i, :, :t]
        return timed(run, device)
    raise Skip(f"no PyTorch baseline for {op}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", required=True, help="JSON of `kvsim bench --list --json`")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--output", help="also write the JSON report here, rewritten after every row")
    args = ap.parse_args()
    device = args.device
    with open(args.cases) as f:
        cases = json.load(f)["cases"]
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    copy_gbs = copy_bandwidth(device)
    rows = []
    report = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                  threads=torch.get_num_threads(), copy_gbs=copy_gbs, rows=rows)
    for case in cases:
        row = dict(case=case["name"], op=case["op"], bytes=case["bytes"])
        try:
            with torch.no_grad():
                t = bench_case(case, device, gen)
            row.update(seconds=t, gbs=case["bytes"] / t / 1e9, copy_ratio=case["bytes"] / t / 1e9 / copy_gbs)
        except Skip as e:
            row.update(skipped=str(e))
        except torch.OutOfMemoryError:
            row.update(skipped="out of memory")
        if device == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        if args.output:  # a run cut short by a time limit still leaves every finished row
            with open(args.output, "w") as f:
                json.dump(report, f, indent=1)
        if not args.json:
            if "seconds" in row:
                print(f"{row['case']:64s} {row['seconds'] * 1e3:10.4f} ms {row['gbs']:8.1f} GB/s "
                      f"{100 * row['copy_ratio']:5.1f}% of copy", flush=True)
            else:
                print(f"{row['case']:64s} skipped: {row['skipped']}", flush=True)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        print(f"# PyTorch {torch.__version__} on {report['device']}; copy bandwidth {copy_gbs:.0f} GB/s")


if __name__ == "__main__":
    main()
