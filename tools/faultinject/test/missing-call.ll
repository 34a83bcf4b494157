; A call runs only when the site does not fire; its result reads as zero
; otherwise.  Calls that must stay (musttail, noreturn, returns_twice,
; inline asm, other intrinsics) are not sites.
; RUN: %opt -S %s | %FileCheck %s

declare i32 @get()
declare void @abort() noreturn
declare i32 @setjmp(ptr) returns_twice

define i32 @f(ptr %jb) {
  %v = call i32 @get()
  %j = call i32 @setjmp(ptr %jb)
  %s = add i32 %v, %j
  %z = icmp eq i32 %s, 7
  br i1 %z, label %die, label %ok
die:
  call void @abort()
  unreachable
ok:
  ret i32 %s
}

; CHECK-LABEL: define internal i32 @f.rk_fi(
; CHECK: %[[RUNS:.*]] = xor i1 %rk_fi_fire, true
; CHECK-NEXT: br i1 %[[RUNS]], label %[[DO:[0-9]+]], label %[[TAIL:[0-9]+]]
; CHECK: [[DO]]:
; CHECK-NEXT: %v = call i32 @get()
; CHECK: [[TAIL]]:
; CHECK-NEXT: %[[V:.*]] = phi i32 [ %v, %[[DO]] ], [ 0, %{{.*}} ]
; CHECK-NOT: br i1 {{.*}} label %{{.*}}
; CHECK: %j = call i32 @setjmp(ptr %jb)
; CHECK: %s = add i32 %[[V]], %j
; CHECK: call void @abort()
