// Umbrella header: core's contract plus its host side -- the named errors,
// every validation, and the host-only tables built while validating (engine
// tensor presets, the RoPE table, append coordinates).
#pragma once

#include "kvsim/core.hpp"
#include "kvsim/validation/engine_presets.hpp"
#include "kvsim/validation/errors.hpp"
#include "kvsim/validation/geometry.hpp"
#include "kvsim/validation/ops/attention.hpp"
#include "kvsim/validation/ops/mla_attention.hpp"
#include "kvsim/validation/ops/qkv_preprocess.hpp"
#include "kvsim/validation/ops/read_copy_ops.hpp"
#include "kvsim/validation/ops/write_ops.hpp"
#include "kvsim/validation/page_table.hpp"
#include "kvsim/validation/rope.hpp"
#include "kvsim/validation/tensor.hpp"
#include "kvsim/validation/window.hpp"
