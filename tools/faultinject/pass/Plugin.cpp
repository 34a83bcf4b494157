// The module pass: finds every function's sites, gives them stable ids
// (module hash : index), plants them in instrumented copies behind function
// gates, registers the module with the runtime, and writes the sites list.
// Loaded by clang (-fpass-plugin, runs last in the optimizer pipeline) or
// by opt (-passes=rekindle-faultinject).
#include "FaultInject.h"

#include "llvm/IR/Constants.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Module.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Passes/PassPlugin.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Transforms/Utils/Cloning.h"
#include "llvm/Transforms/Utils/ModuleUtils.h"

#include <cstdlib>

using namespace llvm;

namespace rekindle_fi {

// For opt; clang parses -mllvm before it loads a pass plugin, so a clang
// build uses the environment variables instead (REKINDLE_FI_SITES,
// REKINDLE_FI_SITES_DIR, REKINDLE_FI_DENY).
static cl::opt<std::string> SitesPath("rekindle-fi-sites", cl::desc("write this module's sites list (JSON) here"),
                                      cl::init(""));
static cl::list<std::string> DenyOpt("rekindle-fi-deny", cl::CommaSeparated,
                                     cl::desc("path substrings whose code gets no faults"));

// The Rekindle runtime's own code (librekindle) never gets faults.
static const char *const DefaultDeny[] = {"runtime/src/", "runtime/include/rekindle"};

static std::vector<std::string> denyPatterns() {
  std::vector<std::string> Out(std::begin(DefaultDeny), std::end(DefaultDeny));
  for (const std::string &D : DenyOpt)
    Out.push_back(D);
  if (const char *Env = std::getenv("REKINDLE_FI_DENY")) {
    SmallVector<StringRef, 8> Parts;
    StringRef(Env).split(Parts, ':', -1, false);
    for (StringRef P : Parts)
      Out.push_back(P.str());
  }
  return Out;
}

// FNV-1a over the module's source name and every site's type, function
// and position: the same source built the same way gives the same hash.
static uint64_t moduleHash(const Module &M, const std::vector<std::pair<Function *, std::vector<Site>>> &Fns) {
  uint64_t H = 0xcbf29ce484222325ull;
  auto Mix = [&H](StringRef S) {
    for (unsigned char C : S)
      H = (H ^ C) * 0x100000001b3ull;
    H = (H ^ 0xff) * 0x100000001b3ull; // field separator
  };
  Mix(M.getSourceFileName());
  for (const auto &[F, Sites] : Fns)
    for (const Site &S : Sites) {
      Mix(F->getName());
      Mix(faultTypeName(S.Type));
      Mix(std::to_string(S.Line) + ":" + std::to_string(S.Col));
    }
  return H;
}

static json::Object siteJson(const Site &S, StringRef Id, StringRef Function) {
  return json::Object{
      {"id", Id.str()},
      {"type", faultTypeName(S.Type)},
      {"function", Function.str()},
      {"file", S.File},
      {"line", S.Line},
      {"col", S.Col},
      {"loc", S.File + ":" + std::to_string(S.Line) + ":" + std::to_string(S.Col)},
      {"description", S.Description},
  };
}

static std::string sitesFilePath(const Module &M, StringRef HashHex) {
  if (!SitesPath.empty())
    return SitesPath;
  if (const char *P = std::getenv("REKINDLE_FI_SITES"); P && *P)
    return P;
  if (const char *D = std::getenv("REKINDLE_FI_SITES_DIR"); D && *D) {
    SmallString<256> Out(D);
    sys::path::append(Out, (sys::path::stem(M.getSourceFileName()) + "-" + HashHex + ".json").str());
    return Out.str().str();
  }
  return "";
}

static void writeSitesFile(Module &M, StringRef Path, json::Value Doc) {
  std::error_code EC;
  raw_fd_ostream OS(Path, EC, sys::fs::OF_Text);
  if (!EC) {
    OS << formatv("{0:2}", Doc) << "\n";
    OS.close();
    EC = OS.error();
  }
  if (EC)
    M.getContext().emitError("rekindle-faultinject: reason=sites_write_failed: cannot write the sites list '" +
                             Path + "': " + EC.message());
}

template <typename T> static GlobalVariable *constArray(Module &M, const std::vector<T> &V, Type *Elt, StringRef Name) {
  std::vector<Constant *> Elts;
  for (T X : V)
    Elts.push_back(ConstantInt::get(Elt, X));
  auto *AT = ArrayType::get(Elt, V.size());
  return new GlobalVariable(M, AT, true, GlobalValue::PrivateLinkage, ConstantArray::get(AT, Elts), Name);
}

static GlobalVariable *flagArray(Module &M, size_t N, StringRef Name) {
  auto *AT = ArrayType::get(Type::getInt8Ty(M.getContext()), N);
  return new GlobalVariable(M, AT, false, GlobalValue::InternalLinkage, ConstantAggregateZero::get(AT), Name);
}

// struct rk_fi_module (include/rekindle_fi.h) and the constructor that
// hands it to __rk_fi_register.
static Guards emitModuleData(Module &M, uint64_t Hash, const std::vector<uint32_t> &SiteFn,
                             const std::vector<uint8_t> &SiteType, size_t NumFns) {
  LLVMContext &Ctx = M.getContext();
  Type *I32 = Type::getInt32Ty(Ctx), *I64 = Type::getInt64Ty(Ctx), *Ptr = PointerType::getUnqual(Ctx);
  Guards G;
  G.SiteOn = flagArray(M, SiteFn.size(), "__rk_fi_site_on");
  G.FnOn = flagArray(M, NumFns, "__rk_fi_fn_on");
  GlobalVariable *FnOf = constArray(M, SiteFn, I32, "__rk_fi_site_fn");
  GlobalVariable *Types = constArray(M, SiteType, Type::getInt8Ty(Ctx), "__rk_fi_site_type");
  Constant *Source = IRBuilder<>(Ctx).CreateGlobalStringPtr(M.getSourceFileName(), "__rk_fi_source", 0, &M);
  auto *DescTy = StructType::get(Ctx, {I32, I32, I64, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr});
  Constant *Init = ConstantStruct::get(
      DescTy, {ConstantInt::get(I32, 1 /* RK_FI_ABI */), ConstantInt::get(I32, SiteFn.size()),
               ConstantInt::get(I64, Hash), G.SiteOn, G.FnOn, FnOf, Types, Source, ConstantPointerNull::get(
                   cast<PointerType>(Ptr)), ConstantPointerNull::get(cast<PointerType>(Ptr))});
  G.Desc = new GlobalVariable(M, DescTy, false, GlobalValue::InternalLinkage, Init, "__rk_fi_module");
  G.Hit = M.getOrInsertFunction("__rk_fi_hit", FunctionType::get(I32, {Ptr, I32}, false));
  if (auto *HitFn = dyn_cast<Function>(G.Hit.getCallee())) {
    HitFn->addFnAttr(Attribute::Cold);
    HitFn->addFnAttr(Attribute::NoUnwind);
  }
  FunctionCallee Reg = M.getOrInsertFunction("__rk_fi_register", FunctionType::get(Type::getVoidTy(Ctx), {Ptr}, false));
  Function *Ctor = Function::Create(FunctionType::get(Type::getVoidTy(Ctx), false), GlobalValue::InternalLinkage,
                                    "__rk_fi_ctor", M);
  IRBuilder<> B(BasicBlock::Create(Ctx, "", Ctor));
  B.CreateCall(Reg, {G.Desc});
  B.CreateRetVoid();
  // 101: before every ordinary constructor, and before the runtime's own
  // check at 102 (runtime/rk_fi_rt.c) that the armed site exists.
  appendToGlobalCtors(M, Ctor, 101);
  return G;
}

// The sites list also travels inside the object (and so the program):
// JSON lines in section rekindle_fi_sites; rekindle-fi-sites prints them.
static void embedSites(Module &M, const std::string &Lines) {
  Constant *Data = ConstantDataArray::getString(M.getContext(), Lines, false);
  auto *GV = new GlobalVariable(M, Data->getType(), true, GlobalValue::PrivateLinkage, Data, "__rk_fi_sites");
  GV->setSection("rekindle_fi_sites");
  GV->setAlignment(Align(1));
  appendToUsed(M, {GV});
}

PreservedAnalyses FaultInjectPass::run(Module &M, ModuleAnalysisManager &MAM) {
  auto &FAM = MAM.getResult<FunctionAnalysisManagerModuleProxy>(M).getManager();
  SiteFilter Filter(M, denyPatterns());
  std::vector<std::pair<Function *, std::vector<Site>>> Fns;
  for (Function &F : M) {
    std::vector<Site> Sites = findSites(F, FAM, Filter);
    if (!Sites.empty())
      Fns.emplace_back(&F, std::move(Sites));
  }
  uint64_t Hash = moduleHash(M, Fns);
  std::string HashHex = formatv("{0:x-16}", Hash).str();
  std::vector<uint32_t> SiteFn;
  std::vector<uint8_t> SiteType;
  json::Array List;
  std::string Lines;
  for (unsigned Fn = 0; Fn < Fns.size(); Fn++)
    for (const Site &S : Fns[Fn].second) {
      std::string Id = HashHex + ":" + std::to_string(SiteFn.size());
      json::Object O = siteJson(S, Id, Fns[Fn].first->getName());
      Lines += formatv("{0}", json::Value(json::Object(O))).str() + "\n";
      List.push_back(std::move(O));
      SiteFn.push_back(Fn);
      SiteType.push_back(static_cast<uint8_t>(S.Type));
    }
  std::string Path = sitesFilePath(M, HashHex);
  if (!Path.empty())
    writeSitesFile(M, Path,
                   json::Object{{"module", HashHex}, {"source", M.getSourceFileName()}, {"sites", std::move(List)}});
  if (Fns.empty())
    return PreservedAnalyses::all();

  Guards G = emitModuleData(M, Hash, SiteFn, SiteType, Fns.size());
  embedSites(M, Lines);
  unsigned Index = 0;
  for (unsigned Fn = 0; Fn < Fns.size(); Fn++) {
    Function &F = *Fns[Fn].first;
    ValueToValueMapTy VMap;
    Function *Copy = CloneFunction(&F, VMap);
    Copy->setName(F.getName() + ".rk_fi");
    Copy->setLinkage(GlobalValue::InternalLinkage);
    Copy->setVisibility(GlobalValue::DefaultVisibility);
    Copy->setComdat(nullptr);
    Copy->setSection(""); // the copy is cold, not wherever F was put
    Copy->addFnAttr(Attribute::Cold);
    Copy->addFnAttr(Attribute::NoInline);
    Copy->removeFnAttr(Attribute::AlwaysInline);
    for (Site S : Fns[Fn].second) {
      S.Inst = cast<Instruction>(VMap[S.Inst]);
      plantSite(S, Index++, G);
    }
    gateFunction(F, *Copy, Fn, G);
  }
  return PreservedAnalyses::none();
}

} // namespace rekindle_fi

extern "C" LLVM_ATTRIBUTE_WEAK PassPluginLibraryInfo llvmGetPassPluginInfo() {
  return {LLVM_PLUGIN_API_VERSION, "rekindle-faultinject", "1", [](PassBuilder &PB) {
            PB.registerOptimizerLastEPCallback([](ModulePassManager &MPM, OptimizationLevel) {
              MPM.addPass(rekindle_fi::FaultInjectPass());
            });
            PB.registerPipelineParsingCallback(
                [](StringRef Name, ModulePassManager &MPM, ArrayRef<PassBuilder::PipelineElement>) {
                  if (Name != "rekindle-faultinject")
                    return false;
                  MPM.addPass(rekindle_fi::FaultInjectPass());
                  return true;
                });
          }};
}
