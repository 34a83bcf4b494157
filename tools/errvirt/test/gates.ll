; Library calls by the model's class: a checked call that can fail becomes
; a gate (checkpoint that returns twice, compensation and the error value
; on the second return); unchecked ones stay inside the transaction;
; irrecoverable calls and unchecked writes end the window first; checked
; writes are output gates; deferrable calls go to the
; run-time's wrappers; calls that write our memory log it first.
; RUN: %opt -S %s | %FileCheck %s
target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

declare i32 @open(ptr, i32, ...)
declare ptr @malloc(i64)
declare ptr @realloc(ptr, i64)
declare ptr @mmap(ptr, i64, i32, i32, i32, i64)
declare i64 @read(i32, ptr, i64)
declare i64 @write(i32, ptr, i64)
declare void @free(ptr)
declare i32 @close(i32)
declare i32 @snprintf(ptr, i64, ptr, ...)
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)

define i32 @gate_open(ptr %path) {
  %fd = call i32 (ptr, i32, ...) @open(ptr %path, i32 0)
  %bad = icmp slt i32 %fd, 0
  %r = select i1 %bad, i32 -1, i32 %fd
  ret i32 %r
}
; CHECK-LABEL: define i32 @gate_open(
; CHECK: call void @__rk_ev_tx_end(i32 [[OPEN:[0-9]+]])
; CHECK-NEXT: %fd = call i32 (ptr, i32, ...) @open(ptr %path, i32 0)
; CHECK-NEXT: %ev.ck = call i64 @__rk_ev_checkpoint(i32 [[OPEN]]) #[[RT:[0-9]+]]
; CHECK: %ev.inject = icmp ne i64 %ev.ck, 0
; CHECK-NEXT: br i1 %ev.inject, label %[[INJ:[0-9]+]], label %[[CONT:[0-9]+]], !prof
; CHECK: [[INJ]]:
; CHECK-NEXT: call void @__rk_ev_compensate(i32 [[OPEN]], i64 %{{.*}}, i64 %{{.*}}, i64 0)
; CHECK: [[CONT]]:
; CHECK-NEXT: %fd.ev = phi i32 [ %fd, %{{.*}} ], [ -1, %[[INJ]] ]
; CHECK-NEXT: %bad = icmp slt i32 %fd.ev, 0

define ptr @gate_malloc_realloc_mmap(ptr %old) {
  %p = call ptr @malloc(i64 8)
  %q = call ptr @realloc(ptr %p, i64 64)
  %m = call ptr @mmap(ptr null, i64 4096, i32 3, i32 34, i32 -1, i64 0)
  store ptr %m, ptr %q
  ret ptr %q
}
; CHECK-LABEL: define ptr @gate_malloc_realloc_mmap(
; CHECK: %p.ev = phi ptr [ %p, %{{.*}} ], [ null, %{{.*}} ]
; CHECK: %q = call ptr @__rk_ev_realloc(ptr %p.ev, i64 64)
; CHECK: %q.ev = phi ptr [ %q, %{{.*}} ], [ null, %{{.*}} ]
; CHECK: %m.ev = phi ptr [ %m, %{{.*}} ], [ inttoptr (i64 -1 to ptr), %{{.*}} ]

define void @embedded(i32 %fd, ptr %b) {
  %n = call i64 @read(i32 %fd, ptr %b, i64 8)
  ret void
}
; An unchecked read cannot divert anything: no gate.
; CHECK-LABEL: define void @embedded(
; CHECK-NOT: __rk_ev_checkpoint
; CHECK: call i64 @read(

define void @irrecoverable(i32 %fd, ptr %b) {
  %n = call i64 @write(i32 %fd, ptr %b, i64 8)
  ret void
}
; CHECK-LABEL: define void @irrecoverable(
; CHECK: call void @__rk_ev_window_close(i32 {{[0-9]+}})
; CHECK-NEXT: %n = call i64 @write(

; A checked write is an output gate: the run-time decides at
; __rk_ev_tx_end_output (given the fd) whether it opens a window (masking
; socket writes) or ends the one running; a rollback to it injects -1 and
; shuts the socket down.
define i64 @output_gate(i32 %fd, ptr %b) {
  %n = call i64 @write(i32 %fd, ptr %b, i64 8)
  %bad = icmp slt i64 %n, 0
  %r = select i1 %bad, i64 0, i64 %n
  ret i64 %r
}
; CHECK-LABEL: define i64 @output_gate(
; CHECK-NOT: __rk_ev_window_close
; CHECK: call void @__rk_ev_tx_end_output(i32 [[WRITE:[0-9]+]], i64 %{{.*}})
; CHECK-NEXT: %n = call i64 @write(i32 %fd, ptr %b, i64 8)
; CHECK-NEXT: %ev.ck = call i64 @__rk_ev_checkpoint(i32 [[WRITE]])
; CHECK: call void @__rk_ev_compensate(i32 [[WRITE]], i64 %{{.*}}, i64 %{{.*}}, i64 %{{.*}})
; CHECK: %n.ev = phi i64 [ %n, %{{.*}} ], [ -1, %{{.*}} ]

define void @deferred(ptr %p, i32 %fd) {
  call void @free(ptr %p)
  %r = call i32 @close(i32 %fd)
  ret void
}
; CHECK-LABEL: define void @deferred(
; CHECK: call void @__rk_ev_free(ptr %p)
; CHECK: call i32 @__rk_ev_close(i32 %fd)

define void @restore(ptr %d, ptr %s, ptr %fmt) {
  call void @llvm.memcpy.p0.p0.i64(ptr %d, ptr %s, i64 24, i1 false)
  %n = call i32 (ptr, i64, ptr, ...) @snprintf(ptr %d, i64 16, ptr %fmt)
  ret void
}
; CHECK-LABEL: define void @restore(
; CHECK: call void @__rk_ev_log_range(ptr %d, i64 24)
; CHECK-NEXT: call void @llvm.memcpy
; CHECK: call void @__rk_ev_log_call(i32 {{[0-9]+}}, i64 %{{.*}}, i64 16, i64 %{{.*}})
; CHECK-NEXT: %n = call i32 (ptr, i64, ptr, ...) @snprintf(

; A call whose failure the program meets only with an abort (a checked
; malloc that asserts) is not a gate: injecting there would trade the crash
; for the abort, so a rollback goes to an earlier gate.
declare void @abort() noreturn
define ptr @malloc_or_abort(i64 %n) {
  %p = call ptr @malloc(i64 %n)
  %bad = icmp eq ptr %p, null
  br i1 %bad, label %die, label %ok
die:
  call void @abort()
  unreachable
ok:
  ret ptr %p
}
; CHECK-LABEL: define ptr @malloc_or_abort(
; CHECK: %p = call ptr @malloc(i64 %n)
; CHECK-NOT: @__rk_ev_checkpoint
; CHECK: ret ptr %p


; CHECK: declare i64 @__rk_ev_checkpoint(i32) #[[RTDECL:[0-9]+]]
; CHECK: attributes #[[RTDECL]] = { nounwind returns_twice }
; CHECK: attributes #[[RT]] = { returns_twice }
