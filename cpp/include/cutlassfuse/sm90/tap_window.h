// The K blocks an output tile needs: the filter's depth taps that reach at least one of
// its pixels.
//
// A dgrad tile's K blocks run over (channel block, s, r, t), t (the depth tap)
// outermost. Where a depth tap reads outside the input for every pixel of the tile (a
// deconvolution's border planes: in a stride-1, kernel-3 layer's first output plane,
// two depth taps in three read below the input), the im2col TMA fills its blocks with
// zeros and the tensor cores multiply them anyway: kb61's GEMM executes 278 GFLOP for
// 232 that reach the output. A 128-pixel tile lies within one or two depth planes of
// layers of more than 128 pixels per plane, so the depth taps reaching it are an
// interval, and their blocks a contiguous range of the K mode: the mainloop starts at
// the first and runs fewer, in the full walk's order, so the products it keeps
// accumulate in the same order. (Rows and columns are whole across a tile: the height
// and width taps reach them all but for tiles of one row.)
#pragma once

#include <cute/int_tuple.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

namespace cutlassfuse::sm90 {

// A phase's unit-stride dgrad along d, as the tap test needs it: output plane o takes
// depth tap t from input plane o + lower_padding - t * dilation, which must lie in
// [0, input_depth). Divisors are FastDivmod (a multiply and a shift): the producer warp
// runs the test at every tile, its next tile's loads waiting on it.
struct TapWindow {
  cutlass::FastDivmod plane;     // output pixels per depth plane
  cutlass::FastDivmod depth;     // output planes per sample
  cutlass::FastDivmod dilation;  // along d
  int input_depth = 1;
  int taps = 1;  // along d
  int lower_padding = 0;
  int pixels = 0;          // M: output pixels of all samples
  int blocks_per_tap = 1;  // K blocks of one depth tap: channel blocks x height x width taps
  bool every_tap = true;   // a GEMM (no taps), or the measurement's baseline
};

// Depth taps from first_tap on, every K block of each: k_tiles blocks in all.
struct TapRange {
  int first_tap;
  int k_tiles;

  CUTLASS_HOST_DEVICE static TapRange every(TapWindow const& w) { return taps(w, 0, w.taps); }

  // The depth taps reaching output pixels first_pixel .. last_pixel (M indices).
  CUTLASS_HOST_DEVICE static TapRange reaching(TapWindow const& w, int first_pixel, int last_pixel) {
    if (w.every_tap) return every(w);
    int first_sample, first_plane, last_sample, last_plane;
    w.depth(first_sample, first_plane, w.plane.div(first_pixel));
    w.depth(last_sample, last_plane, w.plane.div(last_pixel));
    if (first_sample != last_sample) return every(w);  // a tile across samples spans every plane
    return reaching_planes(w, first_plane, last_plane);
  }

  // Tap t reaches plane o iff o + pad - input + 1 <= t * dilation <= o + pad: planes
  // first_plane .. last_plane take an interval of taps.
  CUTLASS_HOST_DEVICE static TapRange reaching_planes(TapWindow const& w, int first_plane, int last_plane) {
    const int below = first_plane + w.lower_padding - w.input_depth + 1;
    const int first = below > 0 ? w.dilation.div(below + w.dilation.divisor - 1) : 0;
    const int last = cute::min(w.taps - 1, w.dilation.div(last_plane + w.lower_padding));
    // No tap reaching (a sub-pixel phase's planes no input maps to): one tap, all of
    // whose blocks read outside the input, keeps the accumulators defined.
    return last < first ? taps(w, 0, 1) : taps(w, first, last - first + 1);
  }

 private:
  CUTLASS_HOST_DEVICE static TapRange taps(TapWindow const& w, int first, int count) {
    return {first, count * w.blocks_per_tap};
  }
};

}  // namespace cutlassfuse::sm90
