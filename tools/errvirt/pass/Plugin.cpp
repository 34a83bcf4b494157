// The module pass and its registration: instruments every function of the
// program (not librekindle's, not the run-time's own), prints what it did
// when asked, and registers with clang (-fpass-plugin, last in the
// optimizer pipeline) and opt (-passes=rekindle-errvirt).
#include "ErrVirt.h"

#include "llvm/IR/Module.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Passes/PassPlugin.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>

using namespace llvm;

namespace rekindle_ev {

// opt takes these; a clang build uses the environment variables, since
// clang parses -mllvm before it loads a plugin.
static cl::opt<bool> NoStackSkip("rekindle-ev-no-stack-skip", cl::desc("log stores to the frame's own allocas"));
static cl::opt<bool> NoFreshSkip("rekindle-ev-no-fresh-skip",
                                 cl::desc("log stores to memory allocated in the same transaction"));
static cl::opt<bool> NoRepeatSkip("rekindle-ev-no-repeat-skip",
                                  cl::desc("check every store, also a word the block checked just before"));
static cl::opt<bool> NoFilter("rekindle-ev-no-filter", cl::desc("log every store, not each word once"));
static cl::opt<bool> NoPreserveMost("rekindle-ev-no-preserve-most",
                                    cl::desc("call the filter's slow path with the C calling convention"));
static cl::opt<bool> NoLocalExec("rekindle-ev-no-local-exec",
                                 cl::desc("reach the run-time's thread-locals through the GOT in a PIE too"));
static cl::opt<bool> NoAllocGates("rekindle-ev-no-alloc-gates",
                                  cl::desc("allocating calls stay inside the transaction (a note frees the block "
                                           "on a rollback) instead of beginning one"));
static cl::opt<bool> Stats("rekindle-ev-stats", cl::desc("print what the pass did, per module"));

static bool envOn(const char *Name) {
  const char *V = std::getenv(Name);
  return V && *V && StringRef(V) != "0";
}

Options options() {
  Options O;
  O.SkipStack = !(NoStackSkip || envOn("REKINDLE_EV_NO_STACK_SKIP"));
  O.SkipFresh = !(NoFreshSkip || envOn("REKINDLE_EV_NO_FRESH_SKIP"));
  O.Filter = !(NoFilter || envOn("REKINDLE_EV_NO_FILTER"));
  O.SkipRepeat = !(NoRepeatSkip || envOn("REKINDLE_EV_NO_REPEAT_SKIP"));
  O.PreserveMost = !(NoPreserveMost || envOn("REKINDLE_EV_NO_PRESERVE_MOST"));
  O.LocalExec = !(NoLocalExec || envOn("REKINDLE_EV_NO_LOCAL_EXEC"));
  O.AllocGates = !(NoAllocGates || envOn("REKINDLE_EV_NO_ALLOC_GATES"));
  return O;
}

// librekindle is a library to the program, never instrumented.
static bool denied(const Module &M) {
  StringRef Src = M.getSourceFileName();
  return Src.contains("runtime/src/") || Src.contains("tools/errvirt/runtime/");
}

PreservedAnalyses ErrVirtPass::run(Module &M, ModuleAnalysisManager &) {
  if (denied(M))
    return PreservedAnalyses::all();
  Options O = options();
  Counts C;
  SmallVector<Function *, 64> Fns;
  for (Function &F : M)
    if (!F.isDeclaration() && !F.getName().starts_with("__rk_ev_") && !F.hasFnAttribute(Attribute::Naked))
      Fns.push_back(&F);
  for (Function *F : Fns)
    instrumentFunction(*F, O, C);
  if (Stats || envOn("REKINDLE_EV_STATS"))
    errs() << "rekindle-errvirt: module=" << M.getSourceFileName() << " functions=" << Fns.size()
           << " stores=" << C.Stores << " logged=" << C.Logged << " skip_stack=" << C.SkipStack
           << " skip_fresh=" << C.SkipFresh << " skip_repeat=" << C.SkipRepeat << " holes=" << C.Holes << " gates=" << C.Gates << " output_gates=" << C.OutputGates << " embedded=" << C.Embedded
           << " deferred=" << C.Deferred << " irrecoverable=" << C.Irrecoverable << " unknown=" << C.Unknown
           << "\n";
  return Fns.empty() ? PreservedAnalyses::all() : PreservedAnalyses::none();
}

} // namespace rekindle_ev

extern "C" LLVM_ATTRIBUTE_WEAK PassPluginLibraryInfo llvmGetPassPluginInfo() {
  return {LLVM_PLUGIN_API_VERSION, "rekindle-errvirt", "1", [](PassBuilder &PB) {
            PB.registerOptimizerLastEPCallback([](ModulePassManager &MPM, OptimizationLevel) {
              MPM.addPass(rekindle_ev::ErrVirtPass());
            });
            PB.registerPipelineParsingCallback(
                [](StringRef Name, ModulePassManager &MPM, ArrayRef<PassBuilder::PipelineElement>) {
                  if (Name != "rekindle-errvirt")
                    return false;
                  MPM.addPass(rekindle_ev::ErrVirtPass());
                  return true;
                });
          }};
}
