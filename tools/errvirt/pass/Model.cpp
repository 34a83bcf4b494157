// The library model (include/libmodel.def) as a name lookup for the pass.
#include "ErrVirt.h"

#include "llvm/ADT/StringMap.h"

using namespace llvm;

namespace rekindle_ev {

static const ModelFn Rows[] = {
#define EV_FN(name, cls, err, errnum, comp, log, wrapper) {EV_FN_##name, #name, cls, err, comp, log, wrapper, errnum},
#include "libmodel.def"
#undef EV_FN
};

std::optional<ModelFn> lookupModel(StringRef Name) {
  static const StringMap<unsigned> Index = [] {
    StringMap<unsigned> M;
    for (const ModelFn &R : Rows)
      M[R.Name] = R.Index;
    return M;
  }();
  auto It = Index.find(Name);
  if (It == Index.end())
    return std::nullopt;
  return Rows[It->second];
}

} // namespace rekindle_ev
