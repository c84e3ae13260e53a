// The spec string: one string names an aggregation and its parameters.
//
//   name[:key=value[,key=value...]]     e.g. "allreduce", "topk:density=0.01"
//
// parse_spec() checks the syntax only: a name of [a-z0-9_] characters, keys of
// [a-z0-9_] characters, each key at most once, non-empty values without ',', '=' or ':'.
// Spaces around tokens are ignored. Which names and keys exist is decided by the
// aggregation registry (gradzip/aggregation.h), which rejects unknown ones with a
// message that lists the valid ones. Every error is a gradzip::SpecError.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gradzip {

class SpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct Spec {
  std::string name;
  std::map<std::string, std::string> params;  // ordered, so str() is canonical

  // The canonical text: name, then the keys in sorted order.
  std::string str() const;

  bool has(const std::string& key) const { return params.count(key) != 0; }
  // Typed reads; a value that does not parse is a SpecError naming the key and the value.
  double get_double(const std::string& key, double fallback) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;  // 1/0, true/false, on/off
  std::string get_string(const std::string& key, const std::string& fallback) const;
};

Spec parse_spec(std::string_view text);

}  // namespace gradzip
