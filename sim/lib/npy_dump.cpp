// .npy files and their manifest: see npy_dump.hpp.
#include "kvsim/sim/npy_dump.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <kvsim/validation/errors.hpp>

namespace kvsim::sim {

namespace {
// Why a file operation failed, as the system says it (": Permission denied").
std::string reason() { return errno != 0 ? ": " + std::string(std::strerror(errno)) : std::string(); }
}  // namespace

NpyDump::NpyDump(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) fail(ErrorCode::bad_argument, "--dump " + dir_ + ": cannot create the folder: " + ec.message());
}

std::string NpyDump::descr_for(CacheDtype t) {
  switch (t) {
    case CacheDtype::fp32: return "<f4";
    case CacheDtype::fp16: return "<f2";
    case CacheDtype::bf16: return "<u2";
    case CacheDtype::int8: return "|i1";
    default: return "|u1";  // fp8 codes, packed nvfp4
  }
}

std::unique_ptr<std::ofstream> NpyDump::begin(const std::string& file, const std::string& descr,
                                              const std::vector<int64_t>& shape, int64_t step, const std::string& op,
                                              int32_t layer, CacheDtype kvsim_dtype) {
  return begin(file, descr, shape, step, op, layer, std::string(dtype_name(kvsim_dtype)));
}

std::unique_ptr<std::ofstream> NpyDump::begin(const std::string& file, const std::string& descr,
                                              const std::vector<int64_t>& shape, int64_t step, const std::string& op,
                                              int32_t layer, const std::string& manifest_dtype) {
  std::string shape_text = "(";
  for (size_t i = 0; i < shape.size(); ++i) shape_text += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  shape_text += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_text + ", }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64, ending in '\n'.
  const size_t total = ((10 + header.size() + 1 + 63) / 64) * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  errno = 0;
  auto out = std::make_unique<std::ofstream>(dir_ + "/" + file, std::ios::binary);
  if (!*out) fail(ErrorCode::bad_argument, "--dump: cannot write " + dir_ + "/" + file + reason());
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out->write(magic, 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xFF), static_cast<char>(len >> 8)};
  out->write(len_bytes, 2);
  out->write(header.data(), static_cast<std::streamsize>(header.size()));
  nlohmann::json e = {{"file", file}, {"step", step},   {"op", op},
                      {"layer", layer}, {"dtype", manifest_dtype}, {"shape", shape}};
  entries_.push_back(e.dump());
  return out;
}

void NpyDump::append(std::ofstream& out, const void* data, size_t bytes, const std::string& file) {
  errno = 0;
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) fail(ErrorCode::bad_argument, "--dump: cannot write " + file + reason());
}

void NpyDump::write(const std::string& file, const void* data, size_t bytes, const std::string& descr,
                    const std::vector<int64_t>& shape, int64_t step, const std::string& op, int32_t layer,
                    CacheDtype kvsim_dtype) {
  auto out = begin(file, descr, shape, step, op, layer, kvsim_dtype);
  append(*out, data, bytes, file);
}

void NpyDump::write_manifest() const {
  nlohmann::json files = nlohmann::json::array();
  for (const std::string& e : entries_) files.push_back(nlohmann::json::parse(e));
  errno = 0;
  std::ofstream out(dir_ + "/manifest.json");
  out << nlohmann::json{{"files", files}}.dump(1) << '\n';
  out.flush();
  if (!out) fail(ErrorCode::bad_argument, "--dump: cannot write " + dir_ + "/manifest.json" + reason());
}

}  // namespace kvsim::sim
