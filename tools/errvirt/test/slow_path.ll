; The inline filter's slow path and the thread-locals it reads.
; - The slow path is __rk_ev_log_word_pm, called with preserve_mostcc (the
;   run-time's trampoline keeps every general register but r11), declared
;   with the same convention; -rekindle-ev-no-preserve-most calls the C
;   entry __rk_ev_log_word instead.
; - In a position-independent executable ("PIE Level" set) the run-time's
;   thread-locals are local-exec: %fs-relative, no GOT load.  Without the
;   flag (a shared object, -fPIC) they stay initial-exec (the last RUN line).
; RUN: %opt -S %s | %FileCheck %s
; RUN: %opt -S -rekindle-ev-no-preserve-most %s | %FileCheck %s --check-prefix=NOPM
; RUN: %opt -S -rekindle-ev-no-local-exec %s | %FileCheck %s --check-prefix=NOLE
; RUN: sed -e '/PIE Level/d' -e 's/^!llvm.module.flags.*//' %s | %opt -S | %FileCheck %s --check-prefix=PIC

target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

@g = global i64 0

define void @global_store(i64 %v) {
  store i64 %v, ptr @g, align 8
  ret void
}
; CHECK-DAG: @__rk_ev_key = external thread_local(localexec) global i64
; CHECK-DAG: @__rk_ev_filter = external thread_local(localexec) global [4096 x i64]
; CHECK-DAG: @__rk_ev_stack_top = external thread_local(localexec) global i64
; CHECK-LABEL: define void @global_store(
; CHECK: %ev.miss = icmp ne i64 %ev.seen, %ev.tag
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(ptr
; CHECK: store i64 %v, ptr @g
; CHECK: declare preserve_mostcc void @__rk_ev_log_word_pm(ptr)
; NOPM-LABEL: define void @global_store(
; NOPM: %ev.miss = icmp ne i64 %ev.seen, %ev.tag
; NOPM: call void @__rk_ev_log_word(ptr
; NOPM-NOT: __rk_ev_log_word_pm
; NOLE-DAG: @__rk_ev_key = external thread_local(initialexec) global i64
; NOLE-DAG: @__rk_ev_filter = external thread_local(initialexec) global [4096 x i64]
; PIC-DAG: @__rk_ev_key = external thread_local(initialexec) global i64
; PIC-DAG: @__rk_ev_filter = external thread_local(initialexec) global [4096 x i64]
; PIC-DAG: @__rk_ev_stack_top = external thread_local(initialexec) global i64
; PIC: call preserve_mostcc void @__rk_ev_log_word_pm(ptr

!llvm.module.flags = !{!0}
!0 = !{i32 7, !"PIE Level", i32 2}
