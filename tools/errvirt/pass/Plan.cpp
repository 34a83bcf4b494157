// What to do with each call, and which stores need no undo log entry.
#include "ErrVirt.h"

#include "llvm/Analysis/ValueTracking.h"
#include "llvm/IR/CFG.h"
#include "llvm/IR/InlineAsm.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/IntrinsicInst.h"

using namespace llvm;

namespace rekindle_ev {

// A gate must be able to return the model's error in the call's own type.
static bool errorFits(const ModelFn &M, Type *Ret) {
  switch (M.Err) {
  case EV_ERR_NEG1:
  case EV_ERR_ERRNO:
    return Ret->isIntegerTy();
  case EV_ERR_NULL:
  case EV_ERR_MAPFAILED:
    return Ret->isPointerTy();
  }
  return false;
}

// The program meets this call's failure only with an abort: its result is
// compared with a constant, and one side of that branch ends in
// `unreachable` (a noreturn assertion: lighttpd's ck_malloc, or
// `if (!p) abort();`).  Injecting the error there would trade the crash for
// an abort, so the call is not a gate and a rollback goes back to an
// earlier one, whose error path the program can survive.
static bool errorPathAborts(const CallBase &CB) {
  for (const User *U : CB.users()) {
    const auto *Cmp = dyn_cast<ICmpInst>(U);
    if (!Cmp || !Cmp->isEquality() || !isa<Constant>(Cmp->getOperand(1)))
      continue;
    for (const User *CU : Cmp->users()) {
      const auto *Br = dyn_cast<BranchInst>(CU);
      if (!Br || !Br->isConditional())
        continue;
      for (const BasicBlock *S : Br->successors())
        if (isa<UnreachableInst>(S->getTerminator()))
          return true;
    }
  }
  return false;
}

// The calls that allocate a block their compensation frees.
static bool allocates(const ModelFn &M) {
  return M.Comp == EV_COMP_FREE_RET || M.Comp == EV_COMP_FREE_DEREF_A0 || M.Comp == EV_COMP_MUNMAP_RET_A1;
}

CallPlan planCall(CallBase &CB, const Options &O) {
  if (CB.isInlineAsm())
    return {&CB, CallKind::Ignored, std::nullopt};
  if (isa<MemIntrinsic>(CB))
    return {&CB, CallKind::MemIntrinsic, std::nullopt};
  Function *Callee = CB.getCalledFunction();
  if (Callee && Callee->isIntrinsic())
    return {&CB, CallKind::Ignored, std::nullopt};
  if (Callee && Callee->getName().starts_with("__rk_ev_"))
    return {&CB, CallKind::Ignored, std::nullopt};
  if (Callee && !Callee->isDeclaration())
    return {&CB, CallKind::Instrumented, std::nullopt};
  std::optional<ModelFn> M = Callee ? lookupModel(Callee->getName()) : std::nullopt;
  if (!M)
    return {&CB, CallKind::Unknown, std::nullopt};
  if (M->Cls == EV_IRRECOV)
    return {&CB, CallKind::Irrecoverable, M};
  // A gate: the call can fail, the program looks at its result (so it has
  // an error path to take), and the result can carry the error.
  bool Checked = M->Err != EV_ERR_NONE && isa<CallInst>(CB) && !cast<CallInst>(CB).isMustTailCall() &&
                 !CB.use_empty() && errorFits(*M, CB.getType()) && !errorPathAborts(CB);
  // A write to a peer is a gate the run-time opens only when it masks
  // socket writes; unchecked, it ends the window like any irrecoverable call.
  if (M->Cls == EV_OUTPUT)
    return {&CB, Checked ? CallKind::Gate : CallKind::Irrecoverable, M};
  bool CanGate = (M->Cls == EV_REVERSIBLE || M->Cls == EV_NOREVERT) && Checked && (O.AllocGates || !allocates(*M));
  return {&CB, CanGate ? CallKind::Gate : CallKind::Embedded, M};
}

// A call after which a different transaction may be running.
static bool beginsTransaction(const CallPlan &P) {
  return P.Kind == CallKind::Gate || P.Kind == CallKind::Instrumented || P.Kind == CallKind::Unknown ||
         P.Kind == CallKind::Irrecoverable;
}

static bool allocatesFresh(const CallPlan &P) {
  return P.Kind == CallKind::Gate && P.Model &&
         (P.Model->Comp == EV_COMP_FREE_RET || P.Model->Comp == EV_COMP_RK_FREE_A0_RET ||
          P.Model->Comp == EV_COMP_MUNMAP_RET_A1);
}

using FreshSet = SmallPtrSet<const Value *, 8>;

// The allocations of the running transaction at each block's entry: a
// forward "must" analysis (intersection at joins; unvisited = everything).
static DenseMap<const BasicBlock *, FreshSet> freshAtEntry(Function &F,
                                                          const DenseMap<CallBase *, CallPlan> &Plans) {
  DenseMap<const BasicBlock *, FreshSet> In, Out;
  DenseMap<const BasicBlock *, bool> Done;
  auto Transfer = [&](const BasicBlock &B, FreshSet S) {
    for (const Instruction &I : B) {
      auto *CB = dyn_cast<CallBase>(&I);
      if (!CB)
        continue;
      auto It = Plans.find(const_cast<CallBase *>(CB));
      if (It == Plans.end() || !beginsTransaction(It->second))
        continue;
      S.clear();
      if (allocatesFresh(It->second))
        S.insert(CB);
    }
    return S;
  };
  bool Changed = true;
  while (Changed) {
    Changed = false;
    for (BasicBlock &B : F) {
      FreshSet S;
      bool First = true;
      if (&B != &F.getEntryBlock())
        for (const BasicBlock *P : predecessors(&B)) {
          if (!Done.lookup(P))
            continue; // not known yet: the top of the lattice
          if (First) {
            S = Out[P];
            First = false;
          } else {
            FreshSet Keep;
            for (const Value *V : S)
              if (Out[P].contains(V))
                Keep.insert(V);
            S = std::move(Keep);
          }
        }
      FreshSet NewOut = Transfer(B, S);
      if (!Done.lookup(&B) || NewOut.size() != Out[&B].size()) {
        Changed = true;
        Done[&B] = true;
        In[&B] = S;
        Out[&B] = std::move(NewOut);
      }
    }
  }
  return In;
}

// The 8-byte word a plain store writes, as the pass can name it: the
// pointer itself, and its base and constant offset.  Anchored: the store is
// 8-aligned, so its word is exactly [Off, Off + 8) from Base.
struct WordRef {
  const Value *Ptr, *Base;
  int64_t Off;
  bool Anchored;
};

// A store the inline filter would check one word for (logStore's word path).
static std::optional<WordRef> wordOf(const StoreInst &SI, const DataLayout &DL) {
  uint64_t Size = DL.getTypeStoreSize(SI.getValueOperand()->getType());
  uint64_t A = SI.getAlign().value();
  if (Size == 0 || Size > 8 || !isPowerOf2_64(Size) || A < Size)
    return std::nullopt;
  int64_t Off = 0;
  const Value *Ptr = SI.getPointerOperand();
  const Value *Base = GetPointerBaseWithConstantOffset(Ptr, Off, DL);
  return WordRef{Ptr, Base, Off, A >= 8};
}

// S lies in the word that Seen checked: the same pointer, or inside an
// anchored word of the same base.
static bool sameWord(const WordRef &Seen, const WordRef &S, uint64_t Size) {
  if (Seen.Ptr == S.Ptr)
    return true;
  return Seen.Anchored && Seen.Base == S.Base && S.Off >= Seen.Off && S.Off + int64_t(Size) <= Seen.Off + 8;
}

StoreSkips findSkips(Function &F, const DenseMap<CallBase *, CallPlan> &Plans, const Options &O,
                     const SmallPtrSetImpl<const AllocaInst *> &Holes) {
  StoreSkips Out;
  const DataLayout &DL = F.getDataLayout();
  DenseMap<const BasicBlock *, FreshSet> In = freshAtEntry(F, Plans);
  for (BasicBlock &B : F) {
    FreshSet Fresh = In[&B];
    SmallVector<WordRef, 16> Checked; // words checked since the last boundary
    for (Instruction &I : B) {
      const Value *Ptr = nullptr;
      if (auto *SI = dyn_cast<StoreInst>(&I))
        Ptr = SI->getPointerOperand();
      else if (auto *RMW = dyn_cast<AtomicRMWInst>(&I))
        Ptr = RMW->getPointerOperand();
      else if (auto *CX = dyn_cast<AtomicCmpXchgInst>(&I))
        Ptr = CX->getPointerOperand();
      else if (auto *MI = dyn_cast<MemIntrinsic>(&I))
        Ptr = MI->getRawDest();
      if (Ptr) {
        const Value *Obj = getUnderlyingObject(Ptr);
        auto *AI = dyn_cast<AllocaInst>(Obj);
        if (O.SkipStack && AI && !Holes.contains(AI))
          Out.Stack.insert(&I);
        else if (O.SkipFresh && Fresh.contains(Obj))
          Out.Fresh.insert(&I);
        else if (auto *SI = dyn_cast<StoreInst>(&I); SI && O.SkipRepeat && O.Filter) {
          if (std::optional<WordRef> W = wordOf(*SI, DL)) {
            uint64_t Size = DL.getTypeStoreSize(SI->getValueOperand()->getType());
            if (any_of(Checked, [&](const WordRef &C) { return sameWord(C, *W, Size); }))
              Out.Repeat.insert(&I);
            else if (Checked.size() < 16)
              Checked.push_back(*W);
          }
        }
      }
      if (auto *CB = dyn_cast<CallBase>(&I)) {
        auto It = Plans.find(CB);
        if (It != Plans.end() && beginsTransaction(It->second)) {
          Fresh.clear();
          Checked.clear();
          if (allocatesFresh(It->second))
            Fresh.insert(CB);
        }
      }
    }
  }
  return Out;
}

} // namespace rekindle_ev
