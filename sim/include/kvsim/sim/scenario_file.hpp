// Scenario files (contract §6): TOML through toml++, strictly checked before
// anything runs. docs/scenarios.md is the format reference.
//
// Every rejection is kvsim::ValidationError(ErrorCode::bad_scenario,
// "FILE:LINE:COLUMN: KEY: expected ..., got ...") -- malformed TOML, an
// unknown key (with the nearest valid key suggested), a wrong type, a value
// out of range, or settings that cannot run together (a geometry core's
// validate_geometry rejects, a window validate_window rejects, a request the
// primary pool cannot hold, a prefix that does not exist, ...).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "scenario.hpp"

namespace kvsim::sim {

// Reads, parses and checks a scenario file. Scenario::name is the file stem,
// Scenario::path the path given, Scenario::description the file's leading
// comment lines.
Scenario load_scenario_file(const std::string& path);

// The same from text; `source_name` stands in for the path in messages and
// its stem becomes the scenario's name.
Scenario parse_scenario(std::string_view toml_text, const std::string& source_name);

// The semantic checks alone (ranges and cross-field rules), for scenarios
// built in C++ too. Uses Scenario::key_locations to place each message.
void check_scenario(const Scenario& s);

// Token ids of generated prompts ([[prefix]] length = N, and requests'
// `generated` tokens): a splitmix64 stream from `seed`, ids in
// 0..kGeneratedVocabulary-1. The same seed always gives the same tokens.
inline constexpr int32_t kGeneratedVocabulary = 32000;
std::vector<int32_t> generated_tokens(uint64_t seed, int64_t count);

// Width of an MLA latent row in pool elements (the pool's head_dim):
// d_ckv + d_kpe, or d_ckv + 2 * d_kpe for nvfp4, whose kpe is fp8 bytes.
int64_t mla_row_width(const Scenario& s);

// The built-in scenarios, sorted: <source dir>/scenarios/*.toml, or the
// installed <prefix>/share/kvsim/scenarios next to the running program.
std::vector<std::string> builtin_scenario_paths();

// The folder builtin_scenario_paths() reads (empty when neither exists).
std::string builtin_scenario_dir();

}  // namespace kvsim::sim
