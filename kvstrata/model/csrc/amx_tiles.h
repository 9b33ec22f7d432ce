// AMX tiles for the integer kernels (int_dot_amx.h's linears, int8_head.cpp's LM head; KVSTRATA_AMX where
// the compiler targets AMX-INT8, -march=native on Sapphire Rapids and later, on Linux) and for the bf16
// scores of paged decode attention (paged_decode_amx.h; KVSTRATA_AMX_BF16 where it also targets AMX-BF16).
//
// Linux hands a process the tiles' state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA);
// amx_ready() asks once, and a kernel falls back to its VNNI form where that is refused. Tile shapes are
// per thread: a kernel's share of a parallel call configures them (TileShapes) and releases them when done,
// so a thread keeps no tile state between calls.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__linux__)
#define KVSTRATA_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

#if defined(__AMX_BF16__)
#define KVSTRATA_AMX_BF16 1
#endif

namespace kvstrata {

inline bool amx_ready() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
}

class TileShapes {  // this thread's tile shapes (palette 1: 8 tiles of up to 16 rows x 64 bytes)
 public:
  TileShapes() = default;
  TileShapes(const TileShapes&) = delete;
  TileShapes& operator=(const TileShapes&) = delete;
  ~TileShapes() {
    if (loaded_) _tile_release();
  }
  // tile t as rows x bytes; takes effect at load()
  void set(int t, int rows, int bytes) {
    if (cfg_.rows[t] == rows && cfg_.colsb[t] == bytes) return;
    cfg_.rows[t] = static_cast<uint8_t>(rows);
    cfg_.colsb[t] = static_cast<uint16_t>(bytes);
    dirty_ = true;
  }
  void load() {  // a no-op when the shapes are those loaded last
    if (!dirty_) return;
    _tile_loadconfig(&cfg_);
    loaded_ = true;
    dirty_ = false;
  }

 private:
  struct alignas(64) Config {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg_;
  bool loaded_ = false, dirty_ = true;
};

}  // namespace kvstrata

#endif
