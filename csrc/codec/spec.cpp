#include "gradzip/spec.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace gradzip {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool is_identifier(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

[[noreturn]] void fail(std::string_view text, const std::string& why) {
  throw SpecError("gradzip: invalid aggregation spec '" + std::string(text) + "': " + why +
                  " (expected name[:key=value[,key=value...]], e.g. 'topk:density=0.01')");
}

}  // namespace

Spec parse_spec(std::string_view text) {
  Spec spec;
  std::string_view rest = text;
  const auto colon = rest.find(':');
  spec.name = std::string(trim(rest.substr(0, colon)));
  if (spec.name.empty()) fail(text, "the name is empty");
  if (!is_identifier(spec.name)) fail(text, "the name '" + spec.name + "' may only hold a-z, 0-9 and _");
  if (colon == std::string_view::npos) return spec;

  rest = rest.substr(colon + 1);
  if (trim(rest).empty()) fail(text, "nothing follows ':'");
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) fail(text, "'" + std::string(item) + "' is not key=value");
    const std::string key(trim(item.substr(0, eq)));
    const std::string value(trim(item.substr(eq + 1)));
    if (!is_identifier(key)) fail(text, "the key '" + key + "' may only hold a-z, 0-9 and _");
    if (value.empty()) fail(text, "the key '" + key + "' has no value");
    if (value.find_first_of("=:") != std::string::npos) {
      fail(text, "the value of '" + key + "' holds '=' or ':'");
    }
    if (!spec.params.emplace(key, value).second) fail(text, "the key '" + key + "' is given twice");
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return spec;
}

std::string Spec::str() const {
  std::string out = name;
  char sep = ':';
  for (const auto& [key, value] : params) {
    out += sep;
    out += key + "=" + value;
    sep = ',';
  }
  return out;
}

namespace {

[[noreturn]] void bad_value(const Spec& spec, const std::string& key, const std::string& value, const char* expected) {
  throw SpecError("gradzip: spec '" + spec.str() + "': key '" + key + "' expects " + expected + ", got '" + value +
                  "'");
}

const std::string& required(const Spec& spec, const std::string* value, const std::string& key) {
  if (!value) {
    throw std::logic_error("gradzip: spec '" + spec.str() + "' has no value and no default for key '" + key + "'");
  }
  return *value;
}

double parse_double(const Spec& spec, const std::string& key, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || *end != '\0') bad_value(spec, key, text, "a number");
  return v;
}

int64_t parse_int(const Spec& spec, const std::string& key, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0') bad_value(spec, key, text, "an integer");
  return v;
}

bool parse_bool(const Spec& spec, const std::string& key, const std::string& text) {
  if (text == "1" || text == "true" || text == "on") return true;
  if (text == "0" || text == "false" || text == "off") return false;
  bad_value(spec, key, text, "a boolean (1/0, true/false, on/off)");
}

}  // namespace

const std::string* Spec::value_of(const std::string& key) const {
  if (auto it = params.find(key); it != params.end()) return &it->second;
  if (auto it = defaults.find(key); it != defaults.end()) return &it->second;
  return nullptr;
}

double Spec::get_double(const std::string& key) const { return parse_double(*this, key, required(*this, value_of(key), key)); }
int64_t Spec::get_int(const std::string& key) const { return parse_int(*this, key, required(*this, value_of(key), key)); }
bool Spec::get_bool(const std::string& key) const { return parse_bool(*this, key, required(*this, value_of(key), key)); }
std::string Spec::get_string(const std::string& key) const { return required(*this, value_of(key), key); }

double Spec::get_double(const std::string& key, double fallback) const {
  const std::string* value = value_of(key);
  return value ? parse_double(*this, key, *value) : fallback;
}

int64_t Spec::get_int(const std::string& key, int64_t fallback) const {
  const std::string* value = value_of(key);
  return value ? parse_int(*this, key, *value) : fallback;
}

bool Spec::get_bool(const std::string& key, bool fallback) const {
  const std::string* value = value_of(key);
  return value ? parse_bool(*this, key, *value) : fallback;
}

std::string Spec::get_string(const std::string& key, const std::string& fallback) const {
  const std::string* value = value_of(key);
  return value ? *value : fallback;
}

}  // namespace gradzip

namespace gradzip {
namespace {

std::string format_number(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out.empty() ? "(none)" : out;
}

}  // namespace

SpecKey SpecKey::number(std::string name, std::string default_value, double low, double high, std::string help) {
  return {std::move(name), Type::kNumber, std::move(default_value), std::move(help), low, high, {}};
}
SpecKey SpecKey::integer(std::string name, std::string default_value, double low, double high, std::string help) {
  return {std::move(name), Type::kInteger, std::move(default_value), std::move(help), low, high, {}};
}
SpecKey SpecKey::boolean(std::string name, std::string default_value, std::string help) {
  return {std::move(name), Type::kBool, std::move(default_value), std::move(help), 0, 0, {}};
}
SpecKey SpecKey::choice(std::string name, std::string default_value, std::vector<std::string> choices,
                        std::string help) {
  return {std::move(name), Type::kChoice, std::move(default_value), std::move(help), 0, 0, std::move(choices)};
}
SpecKey SpecKey::text(std::string name, std::string default_value, std::string help) {
  return {std::move(name), Type::kText, std::move(default_value), std::move(help), 0, 0, {}};
}

std::string SpecKey::expects() const {
  switch (type) {
    case Type::kNumber: return "a number in (" + format_number(low) + ", " + format_number(high) + "]";
    case Type::kInteger:
      if (high >= 9e18) return "an integer >= " + format_number(low);
      return "an integer in [" + format_number(low) + ", " + format_number(high) + "]";
    case Type::kBool: return "a boolean (1/0, true/false, on/off)";
    case Type::kChoice: return "one of " + join(choices);
    case Type::kText: return "text";
  }
  return "";
}

void SpecKey::check(const Spec& spec) const {
  if (!spec.has(name)) return;
  const std::string& value = spec.params.at(name);
  bool valid = true;
  switch (type) {
    case Type::kNumber: {
      const double v = spec.get_double(name, 0.0);
      valid = v > low && v <= high;
      break;
    }
    case Type::kInteger: {
      const double v = static_cast<double>(spec.get_int(name, 0));
      valid = v >= low && v <= high;
      break;
    }
    case Type::kBool:
      spec.get_bool(name, false);
      break;
    case Type::kChoice:
      valid = std::find(choices.begin(), choices.end(), value) != choices.end();
      break;
    case Type::kText:
      break;
  }
  if (!valid) {
    throw SpecError("gradzip: spec '" + spec.str() + "': " + name + " must be " + expects() + ", got '" + value + "'");
  }
}

void fill_defaults(Spec& spec, const std::vector<SpecKey>& keys) {
  for (const auto& key : keys) {
    if (!key.default_value.empty() && !spec.params.count(key.name)) spec.defaults.emplace(key.name, key.default_value);
  }
}

void check_keys(const Spec& spec, const std::vector<SpecKey>& keys, const std::string& what) {
  for (const auto& entry : spec.params) {
    const std::string& key = entry.first;
    auto it = std::find_if(keys.begin(), keys.end(), [&](const SpecKey& k) { return k.name == key; });
    if (it == keys.end()) {
      std::vector<std::string> names;
      for (const auto& k : keys) names.push_back(k.name);
      throw SpecError("gradzip: unknown key '" + key + "' for " + what + " in spec '" + spec.str() +
                      "'; valid keys: " + join(names));
    }
    it->check(spec);
  }
}

}  // namespace gradzip
