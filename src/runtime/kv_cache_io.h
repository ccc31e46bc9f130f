#pragma once
// A KvCache as bytes: the attention-state part of Session::write_state for every backend (the
// CPU backend's cache itself; the CUDA backend copies its device state to and from one), so a
// checkpoint written by one backend loads into the other. The format (little-endian):
//   u32 magic "DS4C", u32 version, u32 ctx at save, u32 n_layer, u8 f16 rows, i64 n_past,
//   then per layer: the raw, compressed and indexer row stores (u32 width, u64 rows, the rows
//   as stored), and the two compressor windows (u32 rows, u32 width, rows x width f32 values,
//   then as many f32 scores).
// Only the rows in use are written, so a state saved with a smaller ctx loads into a larger one
// (the compressed stores hold ctx / ratio + 1 rows, the raw ring sliding_window whatever ctx).
#include <cstdint>
#include <iosfwd>

#include "model/hparams.h"
#include "runtime/kv_cache.h"

namespace ds4::runtime {

void write_kv_cache(std::ostream &out, const KvCache &cache);

// A fresh cache of `ctx` positions and this row format, read from `in`: every count and shape is
// checked against the model and the cache (a state saved with a larger ctx, another row format
// or another position count than n_past is refused), and ds4::Error names the first problem.
// With a range, the state of a stage that holds those layers only (the others' stores empty).
KvCache read_kv_cache(std::istream &in, const model::HParams &hp, uint32_t ctx, bool f16_rows,
                      int64_t n_past, LayerRange range = {});

}  // namespace ds4::runtime
