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
#include <vector>

namespace gradzip {

class SpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct Spec {
  std::string name;
  std::map<std::string, std::string> params;  // as written; ordered, so str() is canonical
  // The key tables' defaults for the keys the spec leaves out (fill_defaults(); a
  // BoundSpec fills in its aggregation's and its codec's). str() and has() see params only.
  std::map<std::string, std::string> defaults;

  // The canonical text: name, then the keys in sorted order.
  std::string str() const;

  // Whether the spec sets `key` itself.
  bool has(const std::string& key) const { return params.count(key) != 0; }
  // Typed reads of a key's value, else its default; a value that does not parse is a
  // SpecError naming the key and the value. Without `fallback`, a key with neither is a
  // std::logic_error (its key table gives no default: the caller must derive one).
  double get_double(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  bool get_bool(const std::string& key) const;  // 1/0, true/false, on/off
  std::string get_string(const std::string& key) const;
  double get_double(const std::string& key, double fallback) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;

 private:
  // The value `key` is read from: the spec's own, else its default; null for neither.
  const std::string* value_of(const std::string& key) const;
};

Spec parse_spec(std::string_view text);

// One key a codec or an aggregation takes: the single source of its name, default,
// valid values and one-line meaning (docs/spec.md's key tables are generated from it).
struct SpecKey {
  enum class Type { kNumber, kInteger, kBool, kChoice, kText };
  std::string name;
  Type type;
  std::string default_value;  // as written in a spec; "" when required or derived (the help says which)
  std::string help;
  double low = 0, high = 0;           // kNumber: low < v <= high; kInteger: low <= v <= high
  std::vector<std::string> choices;   // kChoice

  static SpecKey number(std::string name, std::string default_value, double low, double high, std::string help);
  static SpecKey integer(std::string name, std::string default_value, double low, double high, std::string help);
  static SpecKey boolean(std::string name, std::string default_value, std::string help);
  static SpecKey choice(std::string name, std::string default_value, std::vector<std::string> choices,
                        std::string help);
  static SpecKey text(std::string name, std::string default_value, std::string help);

  // The valid values in words, e.g. "a number in (0, 1]" or "one of l2, max".
  std::string expects() const;
  // Throws SpecError naming the key, its value and expects() when the spec's value is not valid.
  void check(const Spec& spec) const;
};

// Checks that every key of `spec` is one of `keys` (else a SpecError listing them, for
// `what`, e.g. "codec 'topk'") and that every value is valid.
void check_keys(const Spec& spec, const std::vector<SpecKey>& keys, const std::string& what);
// Records the defaults of `keys` (those that have one) for the keys `spec` leaves out.
void fill_defaults(Spec& spec, const std::vector<SpecKey>& keys);

}  // namespace gradzip
