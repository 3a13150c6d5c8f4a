// The K blocks an output tile needs: the filter taps that reach at least one of its
// pixels.
//
// A dgrad tile's K blocks run over (channel block, s, r, t): each is one filter tap
// (its w, h, d offsets) for up to 64 input channels. Where a tap reads outside the
// input for every pixel of the tile (the border planes of a deconvolution: in a
// stride-1, kernel-3 layer's first output plane, two taps in three along d read below
// the input), the im2col TMA fills the block with zeros and the tensor cores multiply
// them anyway: kb61's GEMM executes 278 GFLOP for 232 that reach the output. The taps
// reaching a tile form a box, one interval per spatial dimension, so the mainloop can
// walk that box instead of every tap. It walks it in the full walk's order (channel
// block fastest, then s, r, t), so the products it keeps accumulate in the same order.
//
// Index 0, 1, 2 of every triple below is w, h, d: the order of the GEMM's M mode
// (w, h, d, n) and K mode (c, s, r, t).
#pragma once

#include <cstdint>

#include <cute/int_tuple.hpp>
#include <cute/numeric/integral_constant.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

namespace cutlassfuse::sm90 {

// A phase's unit-stride dgrad as the tap test needs it: output pixel o takes tap s
// from input pixel o + lower_padding - s * dilation, which must lie in [0, input). The
// divisors are FastDivmod (a multiply and a shift): every CTA's producer and consumers
// run the test once per tile, between tiles, where a few hundred instructions of
// integer division measured as a microsecond per tile.
struct TapGeometry {
  cutlass::FastDivmod output[3];  // the output view's extent; M runs over (w, h, d, n)
  int input[3] = {1, 1, 1};
  int taps[3] = {1, 1, 1};
  int lower_padding[3] = {};
  cutlass::FastDivmod dilation[3];
  int pixels = 0;          // M: output pixels of all samples
  int channel_blocks = 1;  // K blocks per tap
  bool every_tap = true;   // a GEMM: no spatial structure, every K block
};

// The taps of one tile (first[i] .. first[i] + count[i] - 1 along dimension i), every
// channel block of each.
struct TapBox {
  int channel_blocks;
  int first[3];
  int count[3];

  CUTLASS_HOST_DEVICE int k_tiles() const { return channel_blocks * count[0] * count[1] * count[2]; }

  // Every tap: a GEMM's box, or one whose pixels some pixel every tap reaches.
  CUTLASS_HOST_DEVICE static TapBox every(TapGeometry const& g) {
    return {g.channel_blocks, {0, 0, 0}, {g.taps[0], g.taps[1], g.taps[2]}};
  }

  // The taps reaching output pixels first_pixel .. last_pixel (M indices, one unit's).
  // Straight-line code over the three dimensions: the producer warp runs it with few
  // registers to spare.
  CUTLASS_HOST_DEVICE static TapBox reaching(TapGeometry const& g, int first_pixel, int last_pixel) {
    if (g.every_tap) return every(g);
    int lo[3], hi[3];
    spanned_coordinates(g, first_pixel, last_pixel, lo, hi);
    TapBox box{g.channel_blocks, {}, {}};
    bool none = false;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 3; ++i) {
      // Tap s reaches o iff o + pad - input + 1 <= s * dilation <= o + pad, for some o
      // in [lo, hi].
      const int below = lo[i] + g.lower_padding[i] - g.input[i] + 1;
      const int first = below > 0 ? g.dilation[i].div(below + g.dilation[i].divisor - 1) : 0;
      const int last = cute::min(g.taps[i] - 1, g.dilation[i].div(hi[i] + g.lower_padding[i]));
      none = none || last < first;
      box.first[i] = first;
      box.count[i] = last - first + 1;
    }
    return none ? no_tap_reaching() : box;
  }

 private:
  // The range of each coordinate the pixels first .. last take: exact for the
  // outermost coordinate that differs between them and those outside it; the whole
  // extent for those inside it (a range of rows crossing a plane covers every w).
  CUTLASS_HOST_DEVICE static void spanned_coordinates(TapGeometry const& g, int first, int last, int* lo, int* hi) {
    int first_at[3], last_at[3];
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 3; ++i) {
      g.output[i](first, first_at[i], first);
      g.output[i](last, last_at[i], last);
    }
    bool same_outside = first == last;  // the sample
    CUTLASS_PRAGMA_UNROLL
    for (int i = 2; i >= 0; --i) {
      lo[i] = same_outside ? first_at[i] : 0;
      hi[i] = same_outside ? last_at[i] : g.output[i].divisor - 1;
      same_outside = same_outside && first_at[i] == last_at[i];
    }
  }

  // No tap reaches the pixels (a sub-pixel phase's pixels that no input maps to): one
  // K block of zeros keeps the mainloop's accumulators defined; tap 0 reads outside the
  // input along the dimension that no tap reaches.
  CUTLASS_HOST_DEVICE static TapBox no_tap_reaching() { return {1, {0, 0, 0}, {1, 1, 1}}; }
};

// A TapBox's K blocks in the mainloop's order, as coordinates (channel block, s, r, t)
// of the collective's K-block mode: no division per block. The producer warp runs with
// 40 registers, already short of CUTLASS's needs, so the tap coordinates and the box's
// bounds are packed a byte each (taps < 32: TMA im2col's filter extent limit).
class TapBoxIterator {
 public:
  CUTLASS_HOST_DEVICE explicit TapBoxIterator(TapBox const& box)
      : channel_blocks_(box.channel_blocks), tap_(pack(box.first[0], box.first[1], box.first[2], 0)),
        bounds_(pack(box.first[0], box.first[0] + box.count[0], box.first[1], box.first[1] + box.count[1])) {}

  CUTLASS_HOST_DEVICE auto operator*() const {
    return cute::make_coord(channel_block_, byte(tap_, 0), byte(tap_, 1), byte(tap_, 2));
  }

  CUTLASS_HOST_DEVICE TapBoxIterator& operator++() {
    if (++channel_block_ < channel_blocks_) return *this;
    channel_block_ = 0;
    tap_ += 1u;  // s + 1
    if (byte(tap_, 0) < byte(bounds_, 1)) return *this;
    tap_ = (tap_ & ~0xffu) + uint32_t(byte(bounds_, 0)) + (1u << 8);  // first s, r + 1
    if (byte(tap_, 1) < byte(bounds_, 3)) return *this;
    tap_ = (tap_ & ~0xff00u) + (uint32_t(byte(bounds_, 2)) << 8) + (1u << 16);  // first r, t + 1
    return *this;
  }

 private:
  CUTLASS_HOST_DEVICE static uint32_t pack(int b0, int b1, int b2, int b3) {
    return uint32_t(b0) | uint32_t(b1) << 8 | uint32_t(b2) << 16 | uint32_t(b3) << 24;
  }
  CUTLASS_HOST_DEVICE static int byte(uint32_t word, int i) { return int(word >> (8 * i) & 0xffu); }

  int channel_blocks_;
  int channel_block_ = 0;
  uint32_t tap_;     // s, r, t
  uint32_t bounds_;  // first s, end of s, first r, end of r
};

}  // namespace cutlassfuse::sm90
