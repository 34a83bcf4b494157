// Planting a site behind its guard, and the function gate.  Unarmed, a
// program runs each function's original body after one load and a branch
// at its entry; the sites live in an instrumented copy that only runs when
// a fault is armed in that function or the run is traced.
#include "FaultInject.h"

#include "llvm/IR/Constants.h"
#include "llvm/IR/DebugInfoMetadata.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/MDBuilder.h"
#include "llvm/Transforms/Utils/BasicBlockUtils.h"

using namespace llvm;

namespace rekindle_fi {

// Unarmed is the expected way by far.
static MDNode *unlikely(LLVMContext &Ctx) { return MDBuilder(Ctx).createBranchWeights(1, 1u << 20); }

static Value *flagByte(IRBuilder<> &B, GlobalVariable *Array, unsigned Index) {
  Value *Ptr = B.CreateConstInBoundsGEP2_32(Array->getValueType(), Array, 0, Index);
  return B.CreateICmpNE(B.CreateLoad(B.getInt8Ty(), Ptr), B.getInt8(0));
}

// Before I: "fire" = site_on[Index] && __rk_fi_hit(desc, Index), as an i1.
static Value *emitFire(Instruction *I, unsigned Index, const Guards &G) {
  IRBuilder<> B(I);
  Value *Open = flagByte(B, G.SiteOn, Index);
  BasicBlock *Head = I->getParent();
  Instruction *ThenTerm = SplitBlockAndInsertIfThen(Open, I, false, unlikely(I->getContext()));
  BasicBlock *Then = ThenTerm->getParent();
  B.SetInsertPoint(ThenTerm);
  Value *Hit = B.CreateCall(G.Hit, {G.Desc, B.getInt32(Index)});
  Value *Fires = B.CreateICmpNE(Hit, B.getInt32(0));
  B.SetInsertPoint(I->getParent(), I->getParent()->begin());
  PHINode *Fire = B.CreatePHI(B.getInt1Ty(), 2, "rk_fi_fire");
  Fire->addIncoming(B.getFalse(), Head);
  Fire->addIncoming(Fires, Then);
  return Fire;
}

// Runs I only when Fire is false; a value it returned reads as zero.
static void skipWhen(Instruction *I, Value *Fire) {
  IRBuilder<> B(I);
  Value *Runs = B.CreateNot(Fire);
  BasicBlock *Head = I->getParent();
  Instruction *ThenTerm = SplitBlockAndInsertIfThen(Runs, I, false);
  BasicBlock *Tail = I->getParent();
  I->moveBefore(ThenTerm);
  if (I->getType()->isVoidTy() || I->use_empty())
    return;
  B.SetInsertPoint(Tail, Tail->begin());
  PHINode *Phi = B.CreatePHI(I->getType(), 2);
  Phi->addIncoming(I, I->getParent());
  Phi->addIncoming(Constant::getNullValue(I->getType()), Head);
  I->replaceUsesWithIf(Phi, [Phi](Use &U) { return U.getUser() != Phi; });
}

// The value a "wrong result stored" writes: 0, or 1 where V is 0.
static Value *wrongValue(IRBuilder<> &B, Value *V) {
  Type *T = V->getType();
  if (T->isIntegerTy())
    return B.CreateZExt(B.CreateICmpEQ(V, Constant::getNullValue(T)), T);
  if (T->isPointerTy()) {
    Constant *One = ConstantExpr::getIntToPtr(B.getInt64(1), T);
    return B.CreateSelect(B.CreateICmpEQ(V, Constant::getNullValue(T)), One, Constant::getNullValue(T));
  }
  Constant *Zero = ConstantFP::get(T, 0.0), *One = ConstantFP::get(T, 1.0);
  return B.CreateSelect(B.CreateFCmpOEQ(V, Zero), One, Zero);
}

void plantSite(const Site &S, unsigned Index, const Guards &G) {
  Instruction *I = S.Inst;
  Value *Fire = emitFire(I, Index, G);
  switch (S.Type) {
  case FaultType::ComparisonInversion: {
    // The inverse predicate is the negation, for fcmp's (un)ordered ones too.
    IRBuilder<> B(I->getNextNode());
    Value *Flipped = B.CreateXor(I, Fire);
    I->replaceUsesWithIf(Flipped, [Flipped](Use &U) { return U.getUser() != Flipped; });
    break;
  }
  case FaultType::WrongOperand: {
    Instruction *Wrong = I->clone();
    Wrong->setOperand(S.Operand, ConstantInt::get(I->getType(), S.Constant));
    Wrong->dropPoisonGeneratingFlags(); // nsw/nuw/exact: the fault is a value, not UB
    Wrong->insertAfter(I);
    IRBuilder<> B(Wrong->getNextNode());
    Value *Sel = B.CreateSelect(Fire, Wrong, I);
    I->replaceUsesWithIf(Sel, [Sel](Use &U) { return U.getUser() != Sel; });
    break;
  }
  case FaultType::MissingIf: {
    auto *Br = cast<BranchInst>(I);
    IRBuilder<> B(Br);
    Br->setCondition(B.CreateSelect(Fire, B.getInt1(S.BranchTo), Br->getCondition()));
    break;
  }
  case FaultType::WrongResultStored: {
    auto *SI = cast<StoreInst>(I);
    IRBuilder<> B(SI);
    Value *V = SI->getValueOperand();
    SI->setOperand(0, B.CreateSelect(Fire, wrongValue(B, V), V));
    break;
  }
  case FaultType::MissingAssignment:
  case FaultType::UninitializedVariable:
  case FaultType::MissingCall:
    skipWhen(I, Fire);
    break;
  }
}

void gateFunction(Function &F, Function &Copy, unsigned FnIndex, const Guards &G) {
  // The gate goes after the entry block's allocas: allocas outside the
  // entry block would become dynamic stack allocations.
  BasicBlock &Entry = F.getEntryBlock();
  auto Split = Entry.begin();
  while (isa<AllocaInst>(*Split))
    ++Split;
  BasicBlock *Body = Entry.splitBasicBlock(Split, "rk_fi_body");
  Entry.getTerminator()->eraseFromParent();
  LLVMContext &Ctx = F.getContext();
  BasicBlock *ToCopy = BasicBlock::Create(Ctx, "rk_fi_armed", &F, Body);
  IRBuilder<> B(&Entry);
  B.CreateCondBr(flagByte(B, G.FnOn, FnIndex), ToCopy, Body, unlikely(Ctx));
  B.SetInsertPoint(ToCopy);
  SmallVector<Value *, 8> Args;
  for (Argument &A : F.args())
    Args.push_back(&A);
  CallInst *Call = B.CreateCall(&Copy, Args);
  Call->setCallingConv(F.getCallingConv());
  Call->setAttributes(F.getAttributes());
  Call->setTailCall();
  if (DISubprogram *SP = F.getSubprogram())
    Call->setDebugLoc(DILocation::get(Ctx, SP->getScopeLine(), 0, SP));
  if (F.getReturnType()->isVoidTy())
    B.CreateRetVoid();
  else
    B.CreateRet(Call);
}

} // namespace rekindle_fi
