// Host side of how this project's kernels are launched (programmatic dependent launch;
// the device side and the rule every kernel keeps are in launch.cuh).
#pragma once

namespace cutlassfuse {

// Whether launches overlap their predecessor: the switch is on (the default) and the
// current device runs code of this build compiled for sm_90 or newer, which contains
// the waits (PTX JIT-compiled from an older virtual architecture does not).
bool programmatic_launch_enabled();
// Process-wide switch, for per-kernel timing and before/after measurements.
void set_programmatic_launch(bool enabled);

}  // namespace cutlassfuse
