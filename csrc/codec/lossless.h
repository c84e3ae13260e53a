// Lossless stage: general-purpose byte compression after a lossy codec (zstd, or blosc
// with its byte shuffle), for payloads that leave through a file or a federated server
// rather than an all-reduce. libzstd and libblosc do the work, in builds made with them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradzip::lossless {

enum class Method : uint8_t { kNone = 0, kZstd = 1, kBlosc = 2 };

// The methods' names, in the order of their bytes: none, zstd, blosc.
std::vector<std::string> method_names();
// A method from its name; throws SpecError for anything else, listing the valid names, and
// for a method whose library this build lacks (codec/system_libraries.h), naming it.
Method method_from_name(const std::string& name);
std::string method_name(Method method);
// A method from its stored byte; throws PayloadError for an unknown one, and for one whose
// library this build lacks.
Method method_from_byte(uint8_t byte);
// The default stage of a model container: zstd where this build has it, else none.
std::string preferred_method();

// The compressed bytes of data[0..size) (data itself for kNone). Deterministic: the same
// input gives the same bytes on every machine (single-threaded, fixed levels).
std::vector<uint8_t> compress(Method method, const uint8_t* data, size_t size);
// The `raw_size` bytes that compress() turned into data[0..size). Throws PayloadError
// when the bytes are not a valid stream of the method or do not hold exactly raw_size
// bytes; never writes more than raw_size bytes.
std::vector<uint8_t> decompress(Method method, const uint8_t* data, size_t size, size_t raw_size);

}  // namespace gradzip::lossless
