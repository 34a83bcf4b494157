; A store becomes conditional on the site not firing.
; RUN: %opt -S %s | %FileCheck %s

@g = global i32 0

define void @f(i32 %v) {
  store i32 %v, ptr @g
  ret void
}

; CHECK-LABEL: define internal void @f.rk_fi(i32 %v)
; CHECK: call i32 @__rk_fi_hit(ptr @__rk_fi_module, i32 0)
; CHECK: %[[FIRE:.*]] = phi i1
; CHECK: %[[RUNS:.*]] = xor i1 %[[FIRE]], true
; CHECK-NEXT: br i1 %[[RUNS]], label %[[DO:[0-9]+]], label %[[SKIP:[0-9]+]]
; CHECK: [[DO]]:
; CHECK: store i32 %{{.*}}, ptr @g
