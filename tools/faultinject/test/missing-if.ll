; The branch of an if without else always takes the side that skips the
; body: the join (if/then/end) or the path past an early exit (if bad
; return).  Loop branches and if/else are not sites.
; RUN: %opt -S %s | %FileCheck %s

declare void @body()

define void @join(i1 %c) {
entry:
  br i1 %c, label %then, label %end
then:
  call void @body()
  br label %end
end:
  ret void
}

define i32 @early(i1 %bad) {
entry:
  br i1 %bad, label %fail, label %work
fail:
  ret i32 -1
work:
  call void @body()
  call void @body()
  br label %more
more:
  call void @body()
  br label %done
done:
  call void @body()
  br label %out
out:
  ret i32 0
}

define void @loop(i32 %n) {
entry:
  br label %head
head:
  %i = phi i32 [ 0, %entry ], [ %i1, %head ]
  %i1 = add i32 %i, 1
  %c = icmp slt i32 %i1, %n
  br i1 %c, label %head, label %exit
exit:
  ret void
}

; CHECK-LABEL: define internal void @join.rk_fi(
; CHECK: %[[C:.*]] = select i1 %{{.*}}, i1 false, i1 %c
; CHECK-NEXT: br i1 %[[C]], label %then, label %end

; CHECK-LABEL: define internal i32 @early.rk_fi(
; CHECK: %[[B:.*]] = select i1 %{{.*}}, i1 false, i1 %bad
; CHECK-NEXT: br i1 %[[B]], label %fail, label %work

; CHECK-LABEL: define internal void @loop.rk_fi(
; CHECK-NOT: select i1 %{{.*}}, i1 {{true|false}}
; CHECK: ret void
