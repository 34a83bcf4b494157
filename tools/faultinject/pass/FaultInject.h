// The fault-injection pass's parts: where sites are found (Sites.cpp), how a
// site is planted behind its run-time guard (Instrument.cpp), and the module
// pass that ties them together and writes the sites list (Plugin.cpp).
#ifndef REKINDLE_FAULTINJECT_H
#define REKINDLE_FAULTINJECT_H

#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/IR/Function.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/PassManager.h"

#include <cstdint>
#include <string>
#include <vector>

namespace rekindle_fi {

// Numbers match RK_FI_TYPES in include/rekindle_fi.h (the runtime's names).
enum class FaultType : uint8_t {
  ComparisonInversion = 0,
  MissingAssignment = 1,
  WrongOperand = 2,
  MissingIf = 3,
  UninitializedVariable = 4,
  WrongResultStored = 5,
  MissingCall = 6,
};

const char *faultTypeName(FaultType T);

struct Site {
  FaultType Type;
  llvm::Instruction *Inst; // in the original function until mapped to the copy
  unsigned Operand = 0;    // WrongOperand: which operand is replaced
  uint64_t Constant = 0;   // WrongOperand: its replacement (0 or 1)
  bool BranchTo = false;   // MissingIf: the successor always taken (true = 0)
  std::string Description;
  std::string File;
  unsigned Line = 0, Col = 0;
};

// Which code may get faults: not functions annotated rekindle_no_fault (nor
// code inlined from them), not code written in a file matching a deny
// pattern (a substring of its path).
class SiteFilter {
public:
  SiteFilter(llvm::Module &M, std::vector<std::string> DenyPatterns);
  bool allowsFunction(const llvm::Function &F) const;
  bool allowsInstruction(const llvm::Instruction &I) const;

private:
  bool deniedPath(llvm::StringRef Path) const;
  std::vector<std::string> Deny;
  llvm::SmallPtrSet<const llvm::Function *, 8> NoFaultFns;
  llvm::SmallPtrSet<const llvm::DISubprogram *, 8> NoFaultSPs;
  std::string ModuleSource;
};

// The candidate sites of F, in a stable order (instruction order, then
// fault type).
std::vector<Site> findSites(llvm::Function &F, llvm::FunctionAnalysisManager &FAM,
                            const SiteFilter &Filter);

// The module-level globals instrumented code reads.
struct Guards {
  llvm::GlobalVariable *SiteOn; // [nsites x i8]
  llvm::GlobalVariable *FnOn;   // [nfunctions x i8]
  llvm::GlobalVariable *Desc;   // struct rk_fi_module
  llvm::FunctionCallee Hit;     // int __rk_fi_hit(desc, site)
};

// Plants S (already mapped into the instrumented copy) as site number Index.
void plantSite(const Site &S, unsigned Index, const Guards &G);

// Puts the function gate at F's entry: when FnOn[FnIndex] is set, F's body
// is the instrumented copy Copy, otherwise F runs untouched.
void gateFunction(llvm::Function &F, llvm::Function &Copy, unsigned FnIndex, const Guards &G);

class FaultInjectPass : public llvm::PassInfoMixin<FaultInjectPass> {
public:
  llvm::PreservedAnalyses run(llvm::Module &M, llvm::ModuleAnalysisManager &MAM);
  static bool isRequired() { return true; }
};

} // namespace rekindle_fi

#endif
