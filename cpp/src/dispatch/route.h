// The walk of a routing table (routing.cpp for the op, block_routing.cpp for the block
// family): the first kernel path whose plan takes the call, and why the ones before it
// did not. A path is {name, plan}, its plan returning the planned call or the reason.
#pragma once

#include <memory>
#include <string>
#include <variant>

namespace cutlassfuse {

template <class Path, class Plan>
struct Routed {
  const Path* path = nullptr;
  std::unique_ptr<Plan> plan;
  std::string why_not_earlier;

  // explain()'s text: the path's name and its plan's description, or `reference` (what
  // runs when no path takes the call), then why the paths before did not.
  std::string explanation(const char* reference) const {
    const std::string because = why_not_earlier.empty() ? "" : ", because " + why_not_earlier;
    if (plan) return std::string(path->name) + ": " + plan->description() + because;
    return std::string(reference) + because;
  }
};

template <class Plan, class Path, size_t N, class Call>
Routed<Path, Plan> route_first(const Path (&paths)[N], const Call& call) {
  Routed<Path, Plan> routed;
  for (const Path& path : paths) {
    auto r = path.plan(call);
    if (auto* plan = std::get_if<std::unique_ptr<Plan>>(&r)) {
      routed.path = &path;
      routed.plan = std::move(*plan);
      return routed;
    }
    routed.why_not_earlier += (routed.why_not_earlier.empty() ? "" : " and ") + std::get<std::string>(r);
  }
  return routed;
}

}  // namespace cutlassfuse
