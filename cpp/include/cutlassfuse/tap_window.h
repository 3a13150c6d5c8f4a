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

#include <cutlass/cutlass.h>

namespace cutlassfuse::sm90 {

// A phase's unit-stride dgrad as the tap test needs it: output pixel o takes tap s
// from input pixel o + lower_padding - s * dilation, which must lie in [0, input).
struct TapGeometry {
  int output[3] = {1, 1, 1};  // the output view; M runs over (w, h, d, n)
  int input[3] = {1, 1, 1};
  int taps[3] = {1, 1, 1};
  int lower_padding[3] = {};
  int dilation[3] = {1, 1, 1};
  int pixels = 0;             // M: output pixels of all samples
  int channel_blocks = 1;     // K blocks per tap
  bool every_tap = true;      // a GEMM: no spatial structure, every K block
};

// The taps of one tile (first[i] .. first[i] + count[i] - 1 along dimension i), every
// channel block of each.
struct TapBox {
  int channel_blocks;
  int taps[3];  // the filter's, which number the K blocks
  int first[3];
  int count[3];

  CUTLASS_HOST_DEVICE int k_tiles() const { return channel_blocks * count[0] * count[1] * count[2]; }

  // The box of every tap: a GEMM's, or a tile's some pixel of which every tap reaches.
  CUTLASS_HOST_DEVICE static TapBox every(TapGeometry const& g) {
    return {g.channel_blocks, {g.taps[0], g.taps[1], g.taps[2]}, {0, 0, 0}, {g.taps[0], g.taps[1], g.taps[2]}};
  }

  // The taps reaching output pixels first_pixel .. last_pixel (M indices, one unit's).
  CUTLASS_HOST_DEVICE static TapBox reaching(TapGeometry const& g, int first_pixel, int last_pixel) {
    TapBox box = every(g);
    if (g.every_tap) return box;
    int lo[3], hi[3];
    spanned_coordinates(g, first_pixel, last_pixel, lo, hi);
    for (int i = 0; i < 3; ++i) {
      // Tap s reaches o iff lo' <= s * dilation <= hi' with lo' = o + pad - input + 1
      // and hi' = o + pad, over o in [lo, hi].
      const int below = lo[i] + g.lower_padding[i] - g.input[i] + 1;
      const int first = below > 0 ? (below + g.dilation[i] - 1) / g.dilation[i] : 0;
      const int reached = (hi[i] + g.lower_padding[i]) / g.dilation[i];
      const int last = reached < g.taps[i] - 1 ? reached : g.taps[i] - 1;
      if (last < first) return no_tap_reaching(g);
      box.first[i] = first;
      box.count[i] = last - first + 1;
    }
    return box;
  }

 private:
  // The range of each coordinate the pixels first .. last take: exact for the
  // outermost coordinate that differs between them and those outside it; the whole
  // extent for those inside it (a range of rows crossing a plane covers every w).
  CUTLASS_HOST_DEVICE static void spanned_coordinates(TapGeometry const& g, int first, int last, int* lo, int* hi) {
    int first_at[3], last_at[3];
    for (int i = 0; i < 3; ++i) {
      first_at[i] = first % g.output[i];
      first /= g.output[i];
      last_at[i] = last % g.output[i];
      last /= g.output[i];
    }
    bool same_outside = first == last;  // the sample
    for (int i = 2; i >= 0; --i) {
      lo[i] = same_outside ? first_at[i] : 0;
      hi[i] = same_outside ? last_at[i] : g.output[i] - 1;
      same_outside = same_outside && first_at[i] == last_at[i];
    }
  }

  // No tap reaches the pixels (a sub-pixel phase's pixels that no input maps to): one
  // K block of zeros keeps the mainloop's accumulators defined, all of its taps read
  // outside the input along the dimension that none reaches.
  CUTLASS_HOST_DEVICE static TapBox no_tap_reaching(TapGeometry const& g) {
    return {1, {g.taps[0], g.taps[1], g.taps[2]}, {0, 0, 0}, {1, 1, 1}};
  }
};

// The K block indices of a TapBox in the mainloop's order, as the linear index of the
// full (channel block, s, r, t) mode that the collective's TMA tensors take.
class TapBoxIterator {
 public:
  CUTLASS_HOST_DEVICE explicit TapBoxIterator(TapBox const& box) : box_(box) {}

  CUTLASS_HOST_DEVICE int operator*() const {
    const int s = box_.first[0] + tap_[0];
    const int r = box_.first[1] + tap_[1];
    const int t = box_.first[2] + tap_[2];
    return channel_block_ + box_.channel_blocks * (s + box_.taps[0] * (r + box_.taps[1] * t));
  }

  CUTLASS_HOST_DEVICE TapBoxIterator& operator++() {
    if (++channel_block_ < box_.channel_blocks) return *this;
    channel_block_ = 0;
    for (int i = 0; i < 3; ++i) {
      if (++tap_[i] < box_.count[i]) return *this;
      tap_[i] = 0;
    }
    return *this;
  }

 private:
  TapBox box_;
  int channel_block_ = 0;
  int tap_[3] = {};
};

}  // namespace cutlassfuse::sm90
