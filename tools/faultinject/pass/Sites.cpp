// Finding the candidate sites of the seven fault types in one function.
#include "FaultInject.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/Analysis/LoopInfo.h"
#include "llvm/Analysis/PostDominators.h"
#include "llvm/Analysis/ValueTracking.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/DebugInfo.h"
#include "llvm/IR/DebugInfoMetadata.h"
#include "llvm/IR/IntrinsicInst.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;

namespace rekindle_fi {

const char *faultTypeName(FaultType T) {
  switch (T) {
  case FaultType::ComparisonInversion:
    return "comparison-inversion";
  case FaultType::MissingAssignment:
    return "missing-assignment";
  case FaultType::WrongOperand:
    return "wrong-operand";
  case FaultType::MissingIf:
    return "missing-if";
  case FaultType::UninitializedVariable:
    return "uninitialized-variable";
  case FaultType::WrongResultStored:
    return "wrong-result-stored";
  case FaultType::MissingCall:
    return "missing-call";
  }
  return "unknown";
}

static std::string fullPath(const DILocation *L) {
  StringRef File = L->getFilename(), Dir = L->getDirectory();
  if (File.starts_with("/") || Dir.empty())
    return File.str();
  return (Dir + "/" + File).str();
}

SiteFilter::SiteFilter(Module &M, std::vector<std::string> DenyPatterns)
    : Deny(std::move(DenyPatterns)), ModuleSource(M.getSourceFileName()) {
  // clang puts annotate("...") on functions into llvm.global.annotations as
  // {ptr fn, ptr "text", ptr file, i32 line, ptr args}.
  GlobalVariable *GA = M.getGlobalVariable("llvm.global.annotations");
  if (!GA || !GA->hasInitializer())
    return;
  auto *Arr = dyn_cast<ConstantArray>(GA->getInitializer());
  if (!Arr)
    return;
  for (const Use &U : Arr->operands()) {
    auto *Entry = dyn_cast<ConstantStruct>(U.get());
    if (!Entry || Entry->getNumOperands() < 2)
      continue;
    auto *Fn = dyn_cast<Function>(Entry->getOperand(0)->stripPointerCasts());
    auto *TextVar = dyn_cast<GlobalVariable>(Entry->getOperand(1)->stripPointerCasts());
    if (!Fn || !TextVar || !TextVar->hasInitializer())
      continue;
    auto *Text = dyn_cast<ConstantDataSequential>(TextVar->getInitializer());
    if (!Text || !Text->isCString() || Text->getAsCString() != "rekindle_no_fault")
      continue;
    NoFaultFns.insert(Fn);
    if (DISubprogram *SP = Fn->getSubprogram())
      NoFaultSPs.insert(SP);
  }
}

bool SiteFilter::deniedPath(StringRef Path) const {
  for (const std::string &P : Deny)
    if (!P.empty() && Path.contains(P))
      return true;
  return false;
}

bool SiteFilter::allowsFunction(const Function &F) const {
  if (F.isDeclaration() || F.isVarArg() || F.hasFnAttribute(Attribute::Naked) ||
      F.hasAvailableExternallyLinkage() || F.getName().starts_with("__rk_fi_"))
    return false;
  if (NoFaultFns.contains(&F))
    return false;
  // A block whose address is taken (computed goto) would be shared by the
  // two copies; leave such functions alone.
  for (const BasicBlock &BB : F)
    if (BB.hasAddressTaken())
      return false;
  if (const DISubprogram *SP = F.getSubprogram()) {
    std::string Path = SP->getFilename().starts_with("/") || SP->getDirectory().empty()
                           ? SP->getFilename().str()
                           : (SP->getDirectory() + "/" + SP->getFilename()).str();
    return !deniedPath(Path);
  }
  return !deniedPath(ModuleSource);
}

bool SiteFilter::allowsInstruction(const Instruction &I) const {
  // Walk the inlining chain: code written in a denied file or in a
  // no-fault function stays denied after it is inlined elsewhere.
  for (const DILocation *L = I.getDebugLoc().get(); L; L = L->getInlinedAt()) {
    if (deniedPath(fullPath(L)))
      return false;
    if (const DISubprogram *SP = L->getScope()->getSubprogram())
      if (NoFaultSPs.contains(SP))
        return false;
  }
  return true;
}

static Site makeSite(FaultType T, Instruction &I, const std::string &Desc) {
  Site S;
  S.Type = T;
  S.Inst = &I;
  S.Description = Desc;
  if (const DILocation *L = I.getDebugLoc().get()) {
    S.File = L->getFilename().str();
    S.Line = L->getLine();
    S.Col = L->getColumn();
  } else if (const DISubprogram *SP = I.getFunction()->getSubprogram()) {
    S.File = SP->getFilename().str();
    S.Line = SP->getLine();
  } else {
    S.File = I.getModule()->getSourceFileName();
  }
  return S;
}

static std::string typeStr(Type *T) {
  if (auto *ST = dyn_cast<StructType>(T); ST && ST->hasName())
    return ST->getName().str();
  std::string S;
  raw_string_ostream OS(S);
  T->print(OS);
  return S;
}

static bool storableScalar(Type *T) {
  return T->isIntegerTy() || T->isPointerTy() || T->isFloatTy() || T->isDoubleTy();
}

// A block that leaves the function (ret/unreachable) within a few
// unconditional steps: the body of "if (bad) return ...;" or "if (bad)
// abort();".
static bool leavesFunction(const BasicBlock *BB) {
  for (int Step = 0; Step < 2 && BB; Step++) {
    const Instruction *T = BB->getTerminator();
    if (isa<ReturnInst>(T) || isa<UnreachableInst>(T))
      return true;
    auto *Br = dyn_cast<BranchInst>(T);
    if (!Br || Br->isConditional())
      return false;
    BB = Br->getSuccessor(0);
  }
  return false;
}

// "Missing if": the branch of an if without else; returns the successor
// that skips the body (the join, or the path past an early exit).
static std::optional<unsigned> ifSkipSuccessor(BranchInst &Br, const PostDominatorTree &PDT,
                                               const LoopInfo &LI) {
  if (!Br.isConditional() || isa<Constant>(Br.getCondition()))
    return std::nullopt;
  BasicBlock *B = Br.getParent(), *T = Br.getSuccessor(0), *F = Br.getSuccessor(1);
  if (T == F)
    return std::nullopt;
  // Loop control (latch, exit, back edge) is not an if statement.
  if (const Loop *L = LI.getLoopFor(B))
    if (!L->contains(T) || !L->contains(F) || T == L->getHeader() || F == L->getHeader())
      return std::nullopt;
  bool TJoin = PDT.dominates(T, B), FJoin = PDT.dominates(F, B);
  if (TJoin != FJoin)
    return TJoin ? 0u : 1u;
  bool TExit = leavesFunction(T), FExit = leavesFunction(F);
  if (TExit != FExit)
    return TExit ? 1u : 0u;
  return std::nullopt; // if/else, or not recognisably an if
}

// "Wrong operand": which operand of a binary operator becomes 0 or 1, and
// which of the two, so that the result really changes.
static bool wrongOperand(BinaryOperator &BO, unsigned &Op, uint64_t &Value) {
  auto *IT = dyn_cast<IntegerType>(BO.getType());
  if (!IT)
    return false;
  switch (BO.getOpcode()) {
  case Instruction::Add:
  case Instruction::Sub:
  case Instruction::Or:
  case Instruction::Xor:
    Op = 1, Value = 1; // 0 would be the identity
    break;
  case Instruction::Shl:
  case Instruction::LShr:
  case Instruction::AShr:
    if (IT->getBitWidth() < 2)
      return false;
    Op = 1, Value = 1;
    break;
  case Instruction::Mul:
  case Instruction::And:
    Op = 1, Value = 0;
    break;
  case Instruction::UDiv:
  case Instruction::SDiv:
  case Instruction::URem:
  case Instruction::SRem:
    Op = 0, Value = 0; // never a zero divisor: that is undefined, not a fault
    break;
  default:
    return false;
  }
  // Already that constant: the other one still changes the result.
  if (auto *C = dyn_cast<ConstantInt>(BO.getOperand(Op)))
    if (C->getValue() == Value)
      Value = 1 - Value;
  return true;
}

static bool skippableCall(CallBase &CB) {
  if (!isa<CallInst>(CB) || CB.isMustTailCall() || CB.isInlineAsm() || CB.doesNotReturn() ||
      CB.hasFnAttr(Attribute::ReturnsTwice))
    return false;
  if (auto *II = dyn_cast<IntrinsicInst>(&CB))
    return isa<MemIntrinsic>(II); // memcpy/memmove/memset are calls in C
  if (Function *Callee = CB.getCalledFunction())
    return !Callee->getName().starts_with("__rk_fi_");
  return true;
}

static std::string calleeName(CallBase &CB) {
  if (auto *MI = dyn_cast<MemIntrinsic>(&CB)) {
    if (isa<MemSetInst>(MI))
      return "memset";
    return isa<MemMoveInst>(MI) ? "memmove" : "memcpy";
  }
  if (Function *Callee = CB.getCalledFunction())
    return Callee->getName().str();
  return "an indirect callee";
}

// The first write to each entry-block alloca, in layout order, when it
// comes before any other use of it: "uninitialized variable" removes it.
static DenseSet<Instruction *> firstAssignments(Function &F) {
  DenseSet<const AllocaInst *> Pending;
  for (Instruction &I : F.getEntryBlock())
    if (auto *AI = dyn_cast<AllocaInst>(&I))
      if (AI->isStaticAlloca())
        Pending.insert(AI);
  DenseSet<Instruction *> First;
  for (BasicBlock &BB : F)
    for (Instruction &I : BB) {
      if (Pending.empty())
        return First;
      if (isa<GetElementPtrInst>(I) || isa<AllocaInst>(I) || I.isLifetimeStartOrEnd() ||
          isa<DbgInfoIntrinsic>(I))
        continue;
      Value *Dest = nullptr;
      if (auto *SI = dyn_cast<StoreInst>(&I))
        Dest = SI->getPointerOperand();
      else if (auto *MI = dyn_cast<MemIntrinsic>(&I))
        Dest = MI->getDest();
      if (Dest)
        if (auto *AI = dyn_cast<AllocaInst>(getUnderlyingObject(Dest)); AI && Pending.erase(AI))
          First.insert(&I);
      for (Value *Op : I.operands())
        if (auto *AI = dyn_cast<AllocaInst>(getUnderlyingObject(Op)))
          Pending.erase(AI); // used (or passed on) before any direct write
    }
  return First;
}

static std::string allocaName(const Instruction &Write) {
  const Value *Dest = isa<StoreInst>(Write) ? cast<StoreInst>(Write).getPointerOperand()
                                            : cast<MemIntrinsic>(Write).getDest();
  auto *AI = const_cast<AllocaInst *>(cast<AllocaInst>(getUnderlyingObject(Dest)));
  // The source name, from the debug info (clang drops IR value names).
  for (DbgVariableRecord *R : findDVRDeclares(AI))
    return "'" + R->getVariable()->getName().str() + "'";
  for (DbgDeclareInst *D : findDbgDeclares(AI))
    return "'" + D->getVariable()->getName().str() + "'";
  if (AI->hasName())
    return "'" + AI->getName().str() + "'";
  return "a local " + typeStr(AI->getAllocatedType());
}

std::vector<Site> findSites(Function &F, FunctionAnalysisManager &FAM, const SiteFilter &Filter) {
  std::vector<Site> Sites;
  if (!Filter.allowsFunction(F))
    return Sites;
  auto &PDT = FAM.getResult<PostDominatorTreeAnalysis>(F);
  auto &LI = FAM.getResult<LoopAnalysis>(F);
  DenseSet<Instruction *> Uninit = firstAssignments(F);
  for (BasicBlock &BB : F)
    for (Instruction &I : BB) {
      if (!Filter.allowsInstruction(I))
        continue;
      if (auto *C = dyn_cast<CmpInst>(&I)) {
        if (C->getType()->isIntegerTy(1))
          Sites.push_back(makeSite(FaultType::ComparisonInversion, I,
                                   std::string(C->isFPPredicate() ? "fcmp " : "icmp ") +
                                       CmpInst::getPredicateName(C->getPredicate()).str() +
                                       " inverted to " +
                                       CmpInst::getPredicateName(C->getInversePredicate()).str()));
      } else if (auto *BO = dyn_cast<BinaryOperator>(&I)) {
        unsigned Op;
        uint64_t Value;
        if (wrongOperand(*BO, Op, Value)) {
          Site S = makeSite(FaultType::WrongOperand, I,
                            std::string(BO->getOpcodeName()) + ": operand " + std::to_string(Op + 1) +
                                " set to " + std::to_string(Value));
          S.Operand = Op, S.Constant = Value;
          Sites.push_back(S);
        }
      } else if (auto *Br = dyn_cast<BranchInst>(&I)) {
        if (auto Succ = ifSkipSuccessor(*Br, PDT, LI)) {
          Site S = makeSite(FaultType::MissingIf, I,
                            std::string("if skipped: the branch always takes its ") +
                                (*Succ == 0 ? "true" : "false") + " side");
          S.BranchTo = *Succ == 0;
          Sites.push_back(S);
        }
      } else if (auto *SI = dyn_cast<StoreInst>(&I)) {
        std::string Ty = typeStr(SI->getValueOperand()->getType());
        if (Uninit.contains(&I))
          Sites.push_back(makeSite(FaultType::UninitializedVariable, I,
                                   "first store to " + allocaName(I) + " removed"));
        else
          Sites.push_back(makeSite(FaultType::MissingAssignment, I, "store of " + Ty + " removed"));
        if (storableScalar(SI->getValueOperand()->getType()))
          Sites.push_back(makeSite(FaultType::WrongResultStored, I,
                                   "store of " + Ty + " writes 0 (1 where the value is 0)"));
      } else if (auto *CB = dyn_cast<CallBase>(&I)) {
        if (!skippableCall(*CB))
          continue;
        if (Uninit.contains(&I))
          Sites.push_back(makeSite(FaultType::UninitializedVariable, I,
                                   "first " + calleeName(*CB) + " of " + allocaName(I) + " removed"));
        else
          Sites.push_back(makeSite(FaultType::MissingCall, I, "call to " + calleeName(*CB) + " removed"));
      }
    }
  return Sites;
}

} // namespace rekindle_fi
