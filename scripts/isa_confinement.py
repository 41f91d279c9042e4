#!/usr/bin/env python3
"""Checks that a library built for baseline x86-64 keeps its wider code where
runtime dispatch can guard it (backends/cpu/cpu_isa.hpp): every function that
uses AVX, AVX2, FMA or AVX-512 instructions (a VEX/EVEX mnemonic, a ymm/zmm
or mask register) must have internal linkage (an anonymous namespace or a
local symbol), so no inline function shared with other files (a COMDAT copy
the linker may pick for every caller) is ever emitted with them.

  isa_confinement.py LIBRARY.a|OBJECT.o   exits 1 naming each offending function
  isa_confinement.py --self-test          proves the rule on synthetic objdump text
"""
import argparse
import re
import subprocess
import sys

FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
# A VEX/EVEX-encoded instruction: AT&T mnemonics of AVX and later start with
# 'v' (verr/verw are 286 system instructions), or name a ymm/zmm/k register.
WIDE = re.compile(r"^\s*[0-9a-f]+:\s+(v(?!err|erw)[a-z0-9]+\b|.*%[yz]mm\d|.*%k[0-7]\b)")


def offenders(objdump_text, local_symbols):
    bad = {}
    fn = None
    for line in objdump_text.splitlines():
        m = FUNC.match(line)
        if m:
            fn = m.group(1)
            continue
        if fn and WIDE.match(line):
            internal = "(anonymous namespace)" in fn or fn in local_symbols
            if not internal:
                bad.setdefault(fn, line.strip())
    return bad


def local_symbols_of(path):
    out = subprocess.run(["nm", "-C", path], capture_output=True, text=True, check=True).stdout
    local = set()
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[1] in ("t", "b", "d", "r"):
            local.add(parts[2])
    return local


def self_test():
    text = """
0000000000000000 <kvsim::(anonymous namespace)::k(float*)>:
   0:	vfmadd231ps %zmm1,%zmm2,%zmm3
0000000000000040 <kvsim::canon::fma_f32(float, float, float)>:
  40:	vfmadd132ss %xmm1,%xmm2,%xmm0
0000000000000080 <kvsim::codec::bf16_to_f32(unsigned short)>:
  80:	movd   %edi,%xmm0
  84:	shl    $0x10,%edi
0000000000000100 <std::vector<float>::resize(unsigned long)>:
 100:	vmovups %ymm0,(%rdi)
0000000000000140 <static_helper(int)>:
 140:	vaddps %ymm0,%ymm1,%ymm2
0000000000000180 <kvsim::masked(int)>:
 180:	kmovw  %edi,%k1
"""
    got = set(offenders(text, {"static_helper(int)"}))
    want = {"kvsim::canon::fma_f32(float, float, float)", "std::vector<float>::resize(unsigned long)", "kvsim::masked(int)"}
    if got != want:
        print(f"self-test FAILED: flagged {sorted(got)}, expected {sorted(want)}")
        return 1
    print(f"self-test: {len(want)} exported functions with wide code flagged, internal and baseline ones not")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("library", nargs="?")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args()
    if a.self_test:
        return self_test()
    if not a.library:
        p.error("a library or object file is required")
    text = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", a.library], capture_output=True, text=True,
                          check=True).stdout
    bad = offenders(text, local_symbols_of(a.library))
    for fn, line in sorted(bad.items()):
        print(f"{a.library}: {fn}: wide instruction outside an internal-linkage function: {line}")
    if bad:
        return 1
    print(f"{a.library}: every function with AVX/AVX2/FMA/AVX-512 code has internal linkage")
    return 0


if __name__ == "__main__":
    sys.exit(main())
