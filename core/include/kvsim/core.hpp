// Umbrella header: the whole backend-agnostic contract of kvsim.
#pragma once

#include "core/bits.hpp"
#include "core/codecs.hpp"
#include "core/config.hpp"
#include "core/dtype.hpp"
#include "core/errors.hpp"
#include "core/geometry.hpp"
#include "core/page_table.hpp"
#include "core/rope.hpp"
#include "core/splitmix64.hpp"
#include "core/window.hpp"
