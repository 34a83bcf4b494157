; Every instrumented function keeps a frame pointer, carries the marker
; word before its entry, and checks at each return whether its frame
; reaches the part of the stack a rollback resumes.  Calls to code the
; pass cannot see check the callee's marker at run time.
; RUN: %opt -S %s | %FileCheck %s
target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

declare void @elsewhere()

define void @f(ptr %fn) {
  call void @elsewhere()
  call void %fn()
  ret void
}
; CHECK: define void @f(ptr %fn) #[[ATTR:[0-9]+]] prefix i64 30248000590670706 {
; CHECK: %ev.magic = load i64, ptr getelementptr (i8, ptr @elsewhere, i64 -8), align 1
; CHECK-NEXT: %ev.foreign = icmp ne i64 %ev.magic, 30248000590670706
; CHECK: call void @__rk_ev_unknown_call(ptr @elsewhere)
; CHECK: call void @elsewhere()
; CHECK: %ev.prefix = getelementptr i8, ptr %fn, i64 -8
; CHECK: call void @__rk_ev_unknown_call(ptr %fn)
; CHECK: call void %fn()
; CHECK: %ev.fp = call ptr @llvm.frameaddress.p0(i32 0)
; CHECK: %ev.cfa = add i64 %{{.*}}, 16
; CHECK: %ev.reaches = icmp uge i64 %ev.cfa, %ev.top
; CHECK: call void @__rk_ev_frame_exit(
; CHECK: ret void
; CHECK: attributes #[[ATTR]] = { "frame-pointer"="all" }
