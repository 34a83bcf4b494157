; The first write to a local after its alloca is skipped when the site
; fires (a later write to it is a missing-assignment site instead); a
; memset counts as the first write.
; RUN: %opt -S %s | %FileCheck %s
; RUN: %opt -disable-output -rekindle-fi-sites=%t.json %s && %FileCheck --check-prefix=SITES %s < %t.json

declare void @use(ptr)
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)

define void @f(i32 %v) {
  %x = alloca i32
  %buf = alloca [8 x i32]
  store i32 %v, ptr %x
  store i32 1, ptr %x
  call void @llvm.memset.p0.i64(ptr %buf, i8 0, i64 32, i1 false)
  call void @use(ptr %x)
  call void @use(ptr %buf)
  ret void
}

; CHECK-LABEL: define internal void @f.rk_fi(
; CHECK: %[[RUNS:.*]] = xor i1 %rk_fi_fire, true
; CHECK-NEXT: br i1 %[[RUNS]], label %[[DO:[0-9]+]], label
; CHECK: [[DO]]:
; CHECK-NOT: ret void
; CHECK: store i32 %{{.*}}, ptr %x
; CHECK: call void @llvm.memset.p0.i64(ptr %buf

; SITES: "description": "first store to 'x' removed"
; SITES: "type": "uninitialized-variable"
; SITES: "description": "store of i32 removed"
; SITES-NEXT: "file"
; SITES: "type": "missing-assignment"
; SITES: "description": "first memset of 'buf' removed"
; SITES: "type": "uninitialized-variable"
