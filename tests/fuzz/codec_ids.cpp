// Prints every registered codec as name:id, one per line: fuzz.sh's decoder targets, so a
// codec added to the registry is fuzzed without another list to edit.
#include <cstdio>

#include "codec/codec_record.h"

int main() {
  for (const auto* record : gradzip::codec_records()) {
    std::printf("%s:%d\n", record->name.c_str(), static_cast<int>(record->id));
  }
}
