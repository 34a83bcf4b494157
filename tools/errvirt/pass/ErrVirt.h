// The error-virtualization pass (docs/errvirt.md): divides a program into
// crash transactions between library calls, logs the stores a rollback
// must undo, checkpoints the registers at each gate, and lets the run-time
// library make a gate's call fail after a crash.
#ifndef REKINDLE_ERRVIRT_H
#define REKINDLE_ERRVIRT_H

#include "rekindle_ev.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/IR/Function.h"
#include "llvm/IR/InstrTypes.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/PassManager.h"

#include <optional>

namespace rekindle_ev {

// One library model row as the pass sees it (include/libmodel.def).
struct ModelFn {
  unsigned Index;
  const char *Name;
  uint8_t Cls, Err, Comp, Log;
  const char *Wrapper;
  int Errno; // what an EV_ERR_ERRNO gate returns
};
std::optional<ModelFn> lookupModel(llvm::StringRef Name);

// What the pass does with one call.
enum class CallKind {
  Instrumented, // defined here: instrumented like this function
  Ignored,      // an intrinsic without memory effects we track, inline asm
  MemIntrinsic, // llvm.memcpy/memmove/memset: log the destination
  Gate,         // begins a transaction; can be made to fail
  Embedded,     // a modelled call inside the transaction
  Irrecoverable,
  Unknown,      // checked at run time: ours (prefix word) or not
};
struct CallPlan {
  llvm::CallBase *Call;
  CallKind Kind;
  std::optional<ModelFn> Model;
};
struct Options;
CallPlan planCall(llvm::CallBase &CB, const Options &O);

// Which pass options are off (to measure each one's share).
struct Options {
  bool SkipStack = true;  // no logging of stores to this frame's allocas
  bool SkipFresh = true;  // nor to memory allocated in this transaction
  bool Filter = true;     // log a word once per transaction
  bool SkipRepeat = true; // no check for a word a store just before checked
  bool PreserveMost = true; // the filter's slow path keeps the caller's registers
  bool LocalExec = true;    // the filter's thread-locals as local-exec in a PIE
  bool AllocGates = true;   // allocating calls begin transactions (off: embedded, with a note)
};
Options options();

// Stores (and memory intrinsics' destinations) that need no log entry:
// their object is this function's alloca, or memory a gate allocated in
// the transaction still running (no gate or unknown call in between).
// Repeat: stores whose word an earlier store of the same block checked,
// with no call between that may begin a transaction (the word is logged
// already, or the window is closed): they need no check of their own.
struct StoreSkips {
  llvm::SmallPtrSet<const llvm::Instruction *, 32> Stack, Fresh, Repeat;
};
// Holes are large allocas (RK_EV_HOLE_MIN bytes or more) left out of the
// frame copies: their stores are logged like any other memory instead.
StoreSkips findSkips(llvm::Function &F, const llvm::DenseMap<llvm::CallBase *, CallPlan> &Plans, const Options &O,
                     const llvm::SmallPtrSetImpl<const llvm::AllocaInst *> &Holes);

struct Counts {
  unsigned Holes = 0, Stores = 0, Logged = 0, SkipStack = 0, SkipFresh = 0, SkipRepeat = 0, Gates = 0, OutputGates = 0, Embedded = 0,
           Irrecoverable = 0, Unknown = 0, Deferred = 0;
};

class ErrVirtPass : public llvm::PassInfoMixin<ErrVirtPass> {
public:
  llvm::PreservedAnalyses run(llvm::Module &M, llvm::ModuleAnalysisManager &MAM);
  static bool isRequired() { return true; }
};

void instrumentFunction(llvm::Function &F, const Options &O, Counts &C);

} // namespace rekindle_ev

#endif
