// Non-tensor arguments as a C++ autograd node keeps them for its backward: one list of
// ints and one of doubles in its saved_data, where one entry per argument cost a hash-map
// insert each (and an allocation for each int list) on every call in grad mode.
#pragma once

#include <torch/autograd.h>

#include <array>
#include <cstdint>
#include <vector>

#include "cutlassfuse/op.h"

namespace cutlassfuse {

// Writes the ints and doubles of a node's arguments in order, then keeps them.
class SavedArgumentsWriter {
 public:
  void add(int64_t value) { ints_.push_back(value); }
  void add(at::IntArrayRef values) { ints_.insert(ints_.end(), values.begin(), values.end()); }
  void add(double value) { doubles_.push_back(value); }
  void save(torch::autograd::AutogradContext* ctx) && {
    ctx->saved_data["ints"] = std::move(ints_);
    ctx->saved_data["doubles"] = std::move(doubles_);
  }

 private:
  std::vector<int64_t> ints_;
  std::vector<double> doubles_;
};

// Reads them back in the order they were written.
class SavedArgumentsReader {
 public:
  explicit SavedArgumentsReader(torch::autograd::AutogradContext* ctx)
      : ints_(ctx->saved_data["ints"].toIntVector()), doubles_(ctx->saved_data["doubles"].toDoubleVector()) {}
  int64_t next_int() { return ints_.at(next_int_++); }
  std::array<int64_t, 3> next_three() { return {next_int(), next_int(), next_int()}; }
  double next_double() { return doubles_.at(next_double_++); }

 private:
  std::vector<int64_t> ints_;
  std::vector<double> doubles_;
  size_t next_int_ = 0, next_double_ = 0;
};

// A convolution's geometry (three values per list, as validated) as a node keeps it.
struct SavedConvGeometry {
  std::array<int64_t, 3> stride, padding, output_padding, dilation;
  int64_t groups;

  static void write(SavedArgumentsWriter& w, at::IntArrayRef stride, at::IntArrayRef padding,
                    at::IntArrayRef output_padding, at::IntArrayRef dilation, int64_t groups) {
    for (at::IntArrayRef values : {stride, padding, output_padding, dilation}) w.add(values);
    w.add(groups);
  }
  static SavedConvGeometry read(SavedArgumentsReader& r) {
    SavedConvGeometry g{};
    for (auto* values : {&g.stride, &g.padding, &g.output_padding, &g.dilation}) *values = r.next_three();
    g.groups = r.next_int();
    return g;
  }
  // Views of this object's arrays: valid while it lives.
  ConvTransposeGeometry geometry() const { return {stride, padding, output_padding, dilation, groups}; }
};

}  // namespace cutlassfuse
