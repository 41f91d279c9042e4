// Uses the installed core: one offset and one codec, checked against
// values worked out by hand, so a broken install fails loudly.
#include <cstdio>

#include <kvsim/validation.hpp>
#include <kvsim/core.hpp>

int main() {
  kvsim::PoolGeometry g;
  g.kv_heads = 8;
  g.head_dim = 128;
  g.tokens_per_block = 16;
  g.primary_blocks = 64;
  kvsim::validate_geometry(g);
  // NHD, in_block: block 9, V, head 2, token 5, dim 5:
  // 9*32768 + 1*16384 + 5*1024 + 2*128 + 5 = 316677
  const int64_t off = kvsim::element_offset(kvsim::contiguous_strides(g), 9, 0, 1, 2, 5, 5);
  const unsigned code = kvsim::codec::f32_to_e4m3(464.0f);  // tie at the overflow edge -> 448 = 0x7e
  std::printf("offset %lld e4m3(464) 0x%02x\n", static_cast<long long>(off), code);
  return (off == 316677 && code == 0x7e) ? 0 : 1;
}
