// --dump DIR (kvsim run): every pool, scale pool, query and attention
// output as a .npy file numpy loads (format 1.0, little endian), plus
// manifest.json naming each file's step, op, layer, kvsim dtype and shape.
// Types numpy has no name for are stored raw: bf16/fp16 as uint16 (fp16 as
// float16), fp8 and int8 codes as uint8/int8, nvfp4 as packed uint8 (two
// elements per byte, element 2i in the low nibble); the manifest's "dtype"
// says which kvsim dtype the bytes hold.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <kvsim/core/dtype.hpp>

namespace kvsim::sim {

class NpyDump {
 public:
  explicit NpyDump(std::string dir);  // creates the folder
  // Writes `bytes` as FILE.npy with numpy dtype `descr` ("<f4", "<u2", "|u1",
  // "|i1", "<f2") and `shape`; adds a manifest entry.
  void write(const std::string& file, const void* data, size_t bytes, const std::string& descr,
             const std::vector<int64_t>& shape, int64_t step, const std::string& op, int32_t layer,
             CacheDtype kvsim_dtype);
  // The same in pieces: begin() writes the header and the manifest entry,
  // append() the bytes (a pool is written in chunks, never copied whole).
  std::unique_ptr<std::ofstream> begin(const std::string& file, const std::string& descr,
                                       const std::vector<int64_t>& shape, int64_t step, const std::string& op,
                                       int32_t layer, CacheDtype kvsim_dtype);
  static void append(std::ofstream& out, const void* data, size_t bytes, const std::string& file);
  void write_manifest() const;
  // The numpy dtype string that stores a kvsim dtype's elements.
  static std::string descr_for(CacheDtype t);

 private:
  std::string dir_;
  std::vector<std::string> entries_;  // JSON objects
};

}  // namespace kvsim::sim
