// The block family's fused kernel path on Hopper: a forward convolution whose epilogue
// adds the bias, applies the activation before the norm and writes the norm's partial
// statistics (sm90/fprop.h), then the finalize and normalize (norm/block_norm.h).
#pragma once

#include "dispatch/block_path.h"

namespace cutlassfuse::sm90 {

BlockRouting plan_fused_block(const BlockCall& call);

}  // namespace cutlassfuse::sm90
