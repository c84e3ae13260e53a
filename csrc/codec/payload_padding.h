// The memory a payload occupies wherever it is stored (slots, payload rows, device
// buffers): its size rounded up to whole 8-byte words, at least one word. The packers
// store and the decoders read whole words, so the bytes past a payload's end up to there
// must be there (and, in slots, zero). Wire bytes do not change with it: every codec's
// payload bound is at least 16 bytes.
#pragma once

#include <cstdint>

namespace gradzip {

constexpr int64_t padded_payload_bytes(int64_t size) { return size < 8 ? 8 : (size + 7) / 8 * 8; }

}  // namespace gradzip
