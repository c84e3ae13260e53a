#include "transport/tag_space.h"

#include <limits>

#ifdef GRADZIP_WITH_MPI
#include "transport/mpi/mpi_backend.h"
#endif

namespace gradzip {

int largest_tag(const c10d::Backend& transport) {
#ifdef GRADZIP_WITH_MPI
  if (const auto* mpi = dynamic_cast<const MpiBackend*>(&transport)) return mpi->largest_tag();
#endif
  return std::numeric_limits<int>::max();
}

}  // namespace gradzip
