#pragma once
// RecordFunction::inputs() carries a debug-only assertion on a flag that LibTorch's release build
// never sets, so every file that reads inputs() must see the header as in release.
#ifndef NDEBUG
#define NDEBUG
#endif
#include <ATen/record_function.h>
