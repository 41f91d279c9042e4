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
#include <type_traits>
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
  // An op's index table or scale list: int32 ("<i4"), int64 ("<i8") or fp32
  // ("<f4") values, the manifest's dtype "int32", "int64" or "fp32".
  template <class T>
  void write_table(const std::string& file, const std::vector<T>& values, const std::vector<int64_t>& shape,
                   int64_t step, const std::string& op, int32_t layer) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8);
    const bool real = std::is_floating_point_v<T>;
    const std::string descr = real ? "<f4" : sizeof(T) == 4 ? "<i4" : "<i8";
    auto out = begin(file, descr, shape, step, op, layer, real ? "fp32" : sizeof(T) == 4 ? "int32" : "int64");
    append(*out, values.data(), values.size() * sizeof(T), file);
  }
  // The same in pieces: begin() writes the header and the manifest entry,
  // append() the bytes (a pool is written in chunks, never copied whole).
  std::unique_ptr<std::ofstream> begin(const std::string& file, const std::string& descr,
                                       const std::vector<int64_t>& shape, int64_t step, const std::string& op,
                                       int32_t layer, CacheDtype kvsim_dtype);
  std::unique_ptr<std::ofstream> begin(const std::string& file, const std::string& descr,
                                       const std::vector<int64_t>& shape, int64_t step, const std::string& op,
                                       int32_t layer, const std::string& manifest_dtype);
  static void append(std::ofstream& out, const void* data, size_t bytes, const std::string& file);
  void write_manifest() const;
  // The numpy dtype string that stores a kvsim dtype's elements.
  static std::string descr_for(CacheDtype t);

 private:
  std::string dir_;
  std::vector<std::string> entries_;  // JSON objects
};

}  // namespace kvsim::sim
