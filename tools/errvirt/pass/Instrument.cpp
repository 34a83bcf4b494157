// Instrumenting one function: the undo log's inline filter before each
// store that needs it, gates after the library calls that begin
// transactions, window ends before irrecoverable calls, run-time checks
// before unknown calls, deferred calls sent to the run-time's wrappers,
// and the frame check at each return.
#include "ErrVirt.h"

#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/IntrinsicInst.h"
#include "llvm/IR/MDBuilder.h"
#include "llvm/IR/Module.h"
#include "llvm/Transforms/Utils/BasicBlockUtils.h"

using namespace llvm;

namespace rekindle_ev {

namespace {

struct Runtime {
  Module &M;
  LLVMContext &Ctx;
  Type *I32, *I64, *Ptr, *Void;
  GlobalVariable *Key, *Filter, *StackTop;
  MDNode *Unlikely;

  explicit Runtime(Module &Mod, const Options &O)
      : M(Mod), Ctx(Mod.getContext()), I32(Type::getInt32Ty(Ctx)), I64(Type::getInt64Ty(Ctx)),
        Ptr(PointerType::getUnqual(Ctx)), Void(Type::getVoidTy(Ctx)) {
    // A position-independent executable holds the run-time itself (the
    // wrapper links it in whole), so its thread-locals are at a fixed
    // offset from %fs: one instruction per access, no GOT load and no
    // register kept for the offset.  A shared object (-fPIC, lighttpd's
    // modules) reaches them through the GOT (initial-exec).
    GlobalValue::ThreadLocalMode TLS = O.LocalExec && M.getPIELevel() != PIELevel::Default
                                           ? GlobalValue::LocalExecTLSModel
                                           : GlobalValue::InitialExecTLSModel;
    Key = tls("__rk_ev_key", I64, TLS);
    Filter = tls("__rk_ev_filter", ArrayType::get(I64, RK_EV_FILTER_SLOTS), TLS);
    StackTop = tls("__rk_ev_stack_top", I64, TLS);
    Unlikely = MDBuilder(Ctx).createUnlikelyBranchWeights();
  }

  GlobalVariable *tls(StringRef Name, Type *T, GlobalValue::ThreadLocalMode TLS) {
    if (GlobalVariable *G = M.getGlobalVariable(Name))
      return G;
    return new GlobalVariable(M, T, false, GlobalValue::ExternalLinkage, nullptr, Name, nullptr, TLS);
  }

  FunctionCallee fn(StringRef Name, Type *Ret, ArrayRef<Type *> Args) {
    FunctionCallee C = M.getOrInsertFunction(Name, FunctionType::get(Ret, Args, false));
    if (auto *F = dyn_cast<Function>(C.getCallee()))
      F->addFnAttr(Attribute::NoUnwind);
    return C;
  }
};

Value *toI64(IRBuilder<> &B, Value *V) {
  Type *I64 = B.getInt64Ty();
  if (V->getType()->isPointerTy())
    return B.CreatePtrToInt(V, I64);
  if (V->getType()->isIntegerTy())
    return B.CreateZExtOrTrunc(V, I64);
  return ConstantInt::get(I64, 0);
}

Value *argI64(IRBuilder<> &B, CallBase &CB, unsigned N) {
  return N < CB.arg_size() ? toI64(B, CB.getArgOperand(N)) : B.getInt64(0);
}

// if (Cond) { call Slow(Args) } before I, Cond expected false
void slowPath(Runtime &R, Instruction *I, Value *Cond, FunctionCallee Slow, ArrayRef<Value *> Args) {
  Instruction *Then = SplitBlockAndInsertIfThen(Cond, I->getIterator(), false, R.Unlikely);
  IRBuilder<> B(Then);
  CallInst *C = B.CreateCall(Slow, Args);
  if (auto *F = dyn_cast<Function>(Slow.getCallee()))
    C->setCallingConv(F->getCallingConv());
}

void logStore(Runtime &R, Instruction *I, Value *Ptr, uint64_t Size, Align A, const Options &O) {
  IRBuilder<> B(I);
  if (Size == 0)
    return;
  if (Size > 8 || !isPowerOf2_64(Size) || A.value() < Size) {
    B.CreateCall(R.fn("__rk_ev_log_range", R.Void, {R.Ptr, R.I64}), {Ptr, B.getInt64(Size)});
    return;
  }
  Value *W = B.CreateAnd(B.CreatePtrToInt(Ptr, R.I64), ~uint64_t(7), "ev.w");
  FunctionCallee Slow = R.fn("__rk_ev_log_word", R.Void, {R.Ptr});
  if (O.Filter && O.PreserveMost) {
    // The slow path through a trampoline (ev_log_word.S) that keeps every
    // general register but r11: the values live across the store need not
    // sit in callee-saved registers or be spilled around the cold call.
    Slow = R.fn("__rk_ev_log_word_pm", R.Void, {R.Ptr});
    cast<Function>(Slow.getCallee())->setCallingConv(CallingConv::PreserveMost);
  }
  if (!O.Filter) {
    B.CreateCall(Slow, {B.CreateIntToPtr(W, R.Ptr)});
    return;
  }
  Value *Idx = B.CreateAnd(B.CreateLShr(W, 3), RK_EV_FILTER_SLOTS - 1, "ev.idx");
  Value *Key = B.CreateLoad(R.I64, B.CreateThreadLocalAddress(R.Key), "ev.key");
  Value *Tag = B.CreateOr(W, Key, "ev.tag");
  Value *Slot = B.CreateGEP(R.I64, B.CreateThreadLocalAddress(R.Filter), Idx, "ev.slot");
  Value *Seen = B.CreateLoad(R.I64, Slot, "ev.seen");
  Value *Miss = B.CreateICmpNE(Seen, Tag, "ev.miss");
  // key 0: no open window on this thread, nothing to log
  Value *Open = B.CreateICmpNE(Key, B.getInt64(0), "ev.open");
  slowPath(R, I, B.CreateAnd(Miss, Open, "ev.log"), Slow, {B.CreateIntToPtr(W, R.Ptr)});
}

Value *errorValue(const ModelFn &M, Type *T) {
  if (M.Err == EV_ERR_NEG1)
    return ConstantInt::get(T, -1, true);
  if (M.Err == EV_ERR_ERRNO)
    return ConstantInt::get(T, M.Errno);
  if (M.Err == EV_ERR_MAPFAILED)
    return ConstantExpr::getIntToPtr(ConstantInt::get(Type::getInt64Ty(T->getContext()), -1), T);
  return ConstantPointerNull::get(cast<PointerType>(T));
}

// A gate whose call allocates a block that its compensation frees: the
// run-time learns the block (ev_fresh.c) and skips its stores' logging.
bool allocatesBlock(const ModelFn &M) {
  return M.Comp == EV_COMP_FREE_RET || M.Comp == EV_COMP_FREE_DEREF_A0 || M.Comp == EV_COMP_MUNMAP_RET_A1;
}

//                                 call @__rk_ev_tx_end(idx)            ; commit: deferred calls run
//                                 (an output call: @__rk_ev_tx_end_output(idx, a0))
// %r = call @lib(...)             %r = call @lib(...)
// use(%r)                  ==>    %c = call @__rk_ev_checkpoint(idx)   ; returns twice
//                                 if (%c != 0) __rk_ev_compensate(idx, %r, a0, a1)
//                                 else __rk_ev_fresh(idx, %r, a0, a1, a2)   ; allocating gates only
//                                 %r.ev = phi [%r, normal], [error, injected]
//                                 use(%r.ev)
void plantGate(Runtime &R, CallInst &CI, const ModelFn &M, const Options &O) {
  SmallVector<Use *, 8> Uses;
  for (Use &U : CI.uses())
    Uses.push_back(&U);
  IRBuilder<> EB(&CI);
  if (M.Cls == EV_OUTPUT)
    // the run-time decides here whether the write opens a window (a socket,
    // masking asked for) or ends the one running (ev_tx.c)
    EB.CreateCall(R.fn("__rk_ev_tx_end_output", R.Void, {R.I32, R.I64}),
                  {ConstantInt::get(R.I32, M.Index), argI64(EB, CI, 0)});
  else
    EB.CreateCall(R.fn("__rk_ev_tx_end", R.Void, {R.I32}), {ConstantInt::get(R.I32, M.Index)});
  Instruction *Next = CI.getNextNode();
  IRBuilder<> B(Next);
  FunctionCallee Ck = R.fn("__rk_ev_checkpoint", R.I64, {R.I32});
  cast<Function>(Ck.getCallee())->addFnAttr(Attribute::ReturnsTwice);
  CallInst *C = B.CreateCall(Ck, {B.getInt32(M.Index)}, "ev.ck");
  C->addFnAttr(Attribute::ReturnsTwice);
  Value *Ret = toI64(B, &CI);
  Value *A0 = argI64(B, CI, 0), *A1 = argI64(B, CI, 1);
  Value *Inj = B.CreateICmpNE(C, B.getInt64(0), "ev.inject");
  BasicBlock *Normal = C->getParent();
  Instruction *Then;
  if (O.SkipFresh && allocatesBlock(M)) {
    // The block is fresh memory of the transaction just begun: the
    // run-time skips the undo log for stores into it (ev_fresh.c).
    Instruction *Else;
    SplitBlockAndInsertIfThenElse(Inj, Next->getIterator(), &Then, &Else, R.Unlikely);
    IRBuilder<> EB(Else);
    EB.CreateCall(R.fn("__rk_ev_fresh", R.Void, {R.I32, R.I64, R.I64, R.I64, R.I64}),
                  {EB.getInt32(M.Index), Ret, A0, A1, argI64(EB, CI, 2)});
    Normal = Else->getParent();
  } else
    Then = SplitBlockAndInsertIfThen(Inj, Next->getIterator(), false, R.Unlikely);
  IRBuilder<> TB(Then);
  TB.CreateCall(R.fn("__rk_ev_compensate", R.Void, {R.I32, R.I64, R.I64, R.I64}), {TB.getInt32(M.Index), Ret, A0, A1});
  BasicBlock *Inject = Then->getParent(), *Tail = Next->getParent();
  PHINode *Phi = PHINode::Create(CI.getType(), 2, CI.getName() + ".ev");
  Phi->insertBefore(Tail->getFirstNonPHIIt());
  Phi->addIncoming(&CI, Normal);
  Phi->addIncoming(errorValue(M, CI.getType()), Inject);
  for (Use *U : Uses)
    U->set(Phi);
}

void logCallArgs(Runtime &R, CallBase &CB, const ModelFn &M) {
  IRBuilder<> B(&CB);
  B.CreateCall(R.fn("__rk_ev_log_call", R.Void, {R.I32, R.I64, R.I64, R.I64}),
               {B.getInt32(M.Index), argI64(B, CB, 0), argI64(B, CB, 1), argI64(B, CB, 2)});
}

void noteCall(Runtime &R, CallBase &CB, const ModelFn &M) {
  if (!isa<CallInst>(CB))
    return;
  IRBuilder<> B(CB.getNextNode());
  Value *Ret = CB.getType()->isVoidTy() ? B.getInt64(0) : toI64(B, &CB);
  B.CreateCall(R.fn("__rk_ev_note", R.Void, {R.I32, R.I64, R.I64, R.I64}),
               {B.getInt32(M.Index), Ret, argI64(B, CB, 0), argI64(B, CB, 1)});
}

// Before a call to code we cannot see: ours carries RK_EV_MAGIC just before
// its entry; anything else ends the recoverable window.
void checkUnknown(Runtime &R, CallBase &CB) {
  IRBuilder<> B(&CB);
  Value *Callee = CB.getCalledOperand();
  Value *At = B.CreateGEP(B.getInt8Ty(), Callee, B.getInt64(-8), "ev.prefix");
  LoadInst *Word = B.CreateAlignedLoad(R.I64, At, Align(1), "ev.magic");
  Value *Foreign = B.CreateICmpNE(Word, B.getInt64(RK_EV_MAGIC), "ev.foreign");
  slowPath(R, &CB, Foreign, R.fn("__rk_ev_unknown_call", R.Void, {R.Ptr}), {Callee});
}

void redirect(Runtime &R, CallBase &CB, const char *Wrapper) {
  FunctionCallee W = R.M.getOrInsertFunction(Wrapper, CB.getFunctionType());
  CB.setCalledFunction(W);
}

// Before a return: if this frame reaches the part of the stack a rollback
// resumes (its end at or above __rk_ev_stack_top), the run-time copies the
// caller's frame first.
void checkExit(Runtime &R, Instruction *Before) {
  IRBuilder<> B(Before);
  Value *FP = B.CreateIntrinsic(Intrinsic::frameaddress, {R.Ptr}, {B.getInt32(0)}, nullptr, "ev.fp");
  Value *FPInt = B.CreatePtrToInt(FP, R.I64);
  Value *End = B.CreateAdd(FPInt, B.getInt64(16), "ev.cfa");
  Value *Top = B.CreateLoad(R.I64, B.CreateThreadLocalAddress(R.StackTop), "ev.top");
  Value *Reaches = B.CreateICmpUGE(End, Top, "ev.reaches");
  slowPath(R, Before, Reaches, R.fn("__rk_ev_frame_exit", R.Void, {R.I64}), {FPInt});
}

} // namespace

void instrumentFunction(Function &F, const Options &O, Counts &C) {
  Runtime R(*F.getParent(), O);
  const DataLayout &DL = F.getDataLayout();
  DenseMap<CallBase *, CallPlan> Plans;
  SmallVector<CallBase *, 32> Calls; // in program order: stable output
  SmallVector<Instruction *, 32> Stores;
  SmallVector<Instruction *, 8> Rets;
  for (BasicBlock &BB : F)
    for (Instruction &I : BB) {
      if (auto *CB = dyn_cast<CallBase>(&I)) {
        Plans[CB] = planCall(*CB, O);
        Calls.push_back(CB);
      }
      else if (isa<StoreInst>(I) || isa<AtomicRMWInst>(I) || isa<AtomicCmpXchgInst>(I))
        Stores.push_back(&I);
      else if (isa<ReturnInst>(I))
        Rets.push_back(&I);
    }
  SmallPtrSet<const AllocaInst *, 4> Holes;
  SmallVector<AllocaInst *, 4> HoleList;
  for (Instruction &I : F.getEntryBlock())
    if (auto *AI = dyn_cast<AllocaInst>(&I); AI && AI->isStaticAlloca())
      if (std::optional<TypeSize> Sz = AI->getAllocationSize(DL); Sz && !Sz->isScalable() &&
                                                                   Sz->getFixedValue() >= RK_EV_HOLE_MIN) {
        Holes.insert(AI);
        HoleList.push_back(AI);
      }
  StoreSkips Skips = findSkips(F, Plans, O, Holes);

  for (Instruction *I : Stores) {
    C.Stores++;
    if (Skips.Stack.contains(I)) {
      C.SkipStack++;
      continue;
    }
    if (Skips.Fresh.contains(I)) {
      C.SkipFresh++;
      continue;
    }
    if (Skips.Repeat.contains(I)) {
      C.SkipRepeat++;
      continue;
    }
    C.Logged++;
    if (auto *SI = dyn_cast<StoreInst>(I))
      logStore(R, I, SI->getPointerOperand(), DL.getTypeStoreSize(SI->getValueOperand()->getType()),
               SI->getAlign(), O);
    else if (auto *RMW = dyn_cast<AtomicRMWInst>(I))
      logStore(R, I, RMW->getPointerOperand(), DL.getTypeStoreSize(RMW->getValOperand()->getType()),
               RMW->getAlign(), O);
    else if (auto *CX = dyn_cast<AtomicCmpXchgInst>(I))
      logStore(R, I, CX->getPointerOperand(), DL.getTypeStoreSize(CX->getNewValOperand()->getType()),
               CX->getAlign(), O);
  }

  for (CallBase *CB : Calls) {
    const CallPlan &P = Plans[CB];
    switch (P.Kind) {
    case CallKind::Instrumented:
    case CallKind::Ignored:
      break;
    case CallKind::MemIntrinsic: {
      C.Stores++;
      if (Skips.Stack.contains(CB) || Skips.Fresh.contains(CB)) {
        (Skips.Stack.contains(CB) ? C.SkipStack : C.SkipFresh)++;
        break;
      }
      C.Logged++;
      auto *MI = cast<MemIntrinsic>(CB);
      IRBuilder<> B(MI);
      B.CreateCall(R.fn("__rk_ev_log_range", R.Void, {R.Ptr, R.I64}),
                   {MI->getRawDest(), B.CreateZExtOrTrunc(MI->getLength(), R.I64)});
      break;
    }
    case CallKind::Irrecoverable: {
      C.Irrecoverable++;
      IRBuilder<> B(CB);
      B.CreateCall(R.fn("__rk_ev_window_close", R.Void, {R.I32}), {B.getInt32(P.Model->Index)});
      break;
    }
    case CallKind::Unknown:
      C.Unknown++;
      checkUnknown(R, *CB);
      break;
    case CallKind::Embedded: {
      C.Embedded++;
      if (P.Model->Cls == EV_DEFER) {
        C.Deferred++;
        redirect(R, *CB, P.Model->Wrapper);
        break;
      }
      if (P.Model->Wrapper)
        redirect(R, *CB, P.Model->Wrapper);
      if (P.Model->Log != EV_LOG_NONE)
        logCallArgs(R, *CB, *P.Model);
      Instruction *After = CB->getNextNode();
      if (P.Model->Comp != EV_COMP_NONE)
        noteCall(R, *CB, *P.Model);
      // The note's block is fresh (the run-time takes it from the note),
      // except posix_memalign's, whose size is its third argument.
      if (O.SkipFresh && P.Model->Comp == EV_COMP_FREE_DEREF_A0 && isa<CallInst>(CB) && After) {
        IRBuilder<> B(After);
        B.CreateCall(R.fn("__rk_ev_fresh", R.Void, {R.I32, R.I64, R.I64, R.I64, R.I64}),
                     {B.getInt32(P.Model->Index), toI64(B, CB), argI64(B, *CB, 0), argI64(B, *CB, 1),
                      argI64(B, *CB, 2)});
      }
      break;
    }
    case CallKind::Gate:
      (P.Model->Cls == EV_OUTPUT ? C.OutputGates : C.Gates)++;
      if (P.Model->Wrapper)
        redirect(R, *CB, P.Model->Wrapper);
      plantGate(R, cast<CallInst>(*CB), *P.Model, O);
      break;
    }
  }

  // Holes are registered once the entry block's allocas exist, and
  // dropped at each return.
  if (!HoleList.empty()) {
    C.Holes += HoleList.size();
    IRBuilder<> B(&*F.getEntryBlock().getFirstNonPHIOrDbgOrAlloca());
    FunctionCallee Push = R.fn("__rk_ev_hole_push", R.Void, {R.Ptr, R.I64});
    for (AllocaInst *AI : HoleList)
      B.CreateCall(Push, {AI, B.getInt64(AI->getAllocationSize(DL)->getFixedValue())});
  }
  for (Instruction *Ret : Rets) {
    Instruction *At = Ret;
    if (auto *Prev = dyn_cast_or_null<CallInst>(Ret->getPrevNode()); Prev && Prev->isMustTailCall())
      At = Prev;
    if (!HoleList.empty()) {
      IRBuilder<> B(At);
      FunctionCallee Pop = R.fn("__rk_ev_hole_pop", R.Void, {R.Ptr});
      for (AllocaInst *AI : reverse(HoleList))
        B.CreateCall(Pop, {AI});
    }
    checkExit(R, At);
  }

  // Every instrumented function keeps a frame pointer (the frame checks walk
  // the chain) and carries the marker word before its entry.
  F.addFnAttr("frame-pointer", "all");
  F.setPrefixData(ConstantInt::get(Type::getInt64Ty(F.getContext()), RK_EV_MAGIC));
}

} // namespace rekindle_ev
