; The module's side: the descriptor the runtime reads (struct rk_fi_module,
; include/rekindle_fi.h), its constructor at priority 101, the sites list
; embedded in section rekindle_fi_sites, and a hash that depends only on
; the source and its sites (so two runs give the same ids).
; RUN: %opt -S %s | %FileCheck %s
; RUN: %opt -disable-output -rekindle-fi-sites=%t.1.json %s
; RUN: %opt -disable-output -rekindle-fi-sites=%t.2.json %s
; RUN: diff %t.1.json %t.2.json
; RUN: %FileCheck --check-prefix=JSON %s < %t.1.json

source_filename = "module.c"

define i32 @f(i32 %x) {
  %c = icmp eq i32 %x, 0
  %r = select i1 %c, i32 1, i32 2
  ret i32 %r
}

define i32 @g(i32 %x) {
  %s = sub i32 %x, 3
  ret i32 %s
}

; CHECK: @__rk_fi_site_on = internal global [2 x i8] zeroinitializer
; CHECK: @__rk_fi_fn_on = internal global [2 x i8] zeroinitializer
; CHECK: @__rk_fi_site_fn = private constant [2 x i32] [i32 0, i32 1]
; CHECK: @__rk_fi_site_type = private constant [2 x i8] c"\00\02"
; CHECK: @__rk_fi_module = internal global { i32, i32, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr } { i32 1, i32 2, i64 [[HASH:-?[0-9]+]], ptr @__rk_fi_site_on, ptr @__rk_fi_fn_on, ptr @__rk_fi_site_fn, ptr @__rk_fi_site_type, ptr @__rk_fi_source, ptr null, ptr null }
; CHECK: @llvm.global_ctors = appending global [1 x { i32, ptr, ptr }] [{ i32, ptr, ptr } { i32 101, ptr @__rk_fi_ctor, ptr null }]
; CHECK: @__rk_fi_sites = private constant [{{[0-9]+}} x i8] c"{\22col\22:0,\22description\22:\22icmp eq inverted to ne\22,{{.*}}\22type\22:\22comparison-inversion\22}\0A{{.*}}\22type\22:\22wrong-operand\22}\0A", section "rekindle_fi_sites", align 1
; CHECK: define internal void @__rk_fi_ctor()
; CHECK-NEXT: call void @__rk_fi_register(ptr @__rk_fi_module)

; JSON: "module": "[[MOD:[0-9a-f]{16}]]"
; JSON: "id": "[[MOD]]:0"
; JSON: "loc": "module.c:0:0"
; JSON: "type": "comparison-inversion"
; JSON: "function": "g"
; JSON-NEXT: "id": "[[MOD]]:1"
