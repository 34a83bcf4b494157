; No faults in a function annotated rekindle_no_fault (RK_NO_FAULT), in
; code inlined from it, or in code written in a denied file (default: the
; Rekindle runtime's sources; more with -rekindle-fi-deny or
; REKINDLE_FI_DENY).
; RUN: %opt -S %s | %FileCheck %s
; RUN: %opt -S -rekindle-fi-deny=app/secret %s | %FileCheck --check-prefix=DENY %s
; RUN: env REKINDLE_FI_DENY=other:app/secret %opt -S %s | %FileCheck --check-prefix=DENY %s

source_filename = "app/main.c"

@.str = private constant [18 x i8] c"rekindle_no_fault\00", section "llvm.metadata"
@.file = private constant [11 x i8] c"app/main.c\00", section "llvm.metadata"
@llvm.global.annotations = appending global [1 x { ptr, ptr, ptr, i32, ptr }] [{ ptr, ptr, ptr, i32, ptr } { ptr @keep, ptr @.str, ptr @.file, i32 3, ptr null }], section "llvm.metadata"

define i32 @keep(i32 %x) !dbg !10 {
  %c = icmp eq i32 %x, 0, !dbg !14
  %r = zext i1 %c to i32
  ret i32 %r
}

; @user has its own compare, one inlined from @keep, one inlined from a
; function of runtime/src/, and one written in app/secret.c.
define i32 @user(i32 %x) !dbg !20 {
  %own = icmp ult i32 %x, 5, !dbg !21
  %inl = icmp eq i32 %x, 0, !dbg !22
  %rt = icmp sgt i32 %x, 9, !dbg !24
  %sec = icmp slt i32 %x, 2, !dbg !27
  %a = and i1 %own, %inl
  %b = and i1 %rt, %sec
  %o = or i1 %a, %b
  %r = zext i1 %o to i32
  ret i32 %r
}

; CHECK-NOT: define {{.*}} @keep.rk_fi
; CHECK-LABEL: define internal i32 @user.rk_fi(
; CHECK: %own = icmp ult i32 %x, 5
; CHECK-NEXT: xor i1 %own
; CHECK: %inl = icmp eq i32 %x, 0
; CHECK-NOT: xor i1 %inl
; CHECK: %rt = icmp sgt i32 %x, 9
; CHECK-NOT: xor i1 %rt
; CHECK: %sec = icmp slt i32 %x, 2
; CHECK-NEXT: xor i1 %sec

; DENY-LABEL: define internal i32 @user.rk_fi(
; DENY: %sec = icmp slt i32 %x, 2
; DENY-NOT: xor i1 %sec

!llvm.dbg.cu = !{!0}
!llvm.module.flags = !{!2, !3}
!0 = distinct !DICompileUnit(language: DW_LANG_C11, file: !1, emissionKind: FullDebug)
!1 = !DIFile(filename: "app/main.c", directory: "/src")
!2 = !{i32 2, !"Debug Info Version", i32 3}
!3 = !{i32 7, !"Dwarf Version", i32 5}
!5 = !DISubroutineType(types: !{})
!10 = distinct !DISubprogram(name: "keep", scope: !1, file: !1, line: 3, type: !5, unit: !0, spFlags: DISPFlagDefinition)
!14 = !DILocation(line: 4, column: 3, scope: !10)
!20 = distinct !DISubprogram(name: "user", scope: !1, file: !1, line: 10, type: !5, unit: !0, spFlags: DISPFlagDefinition)
!21 = !DILocation(line: 11, column: 3, scope: !20)
!22 = !DILocation(line: 4, column: 3, scope: !10, inlinedAt: !23)
!23 = !DILocation(line: 12, column: 3, scope: !20)
!24 = !DILocation(line: 50, column: 1, scope: !25, inlinedAt: !26)
!25 = distinct !DISubprogram(name: "rk_thing", scope: !28, file: !28, line: 49, type: !5, unit: !0, spFlags: DISPFlagDefinition)
!26 = !DILocation(line: 13, column: 3, scope: !20)
!27 = !DILocation(line: 7, column: 2, scope: !29)
!28 = !DIFile(filename: "runtime/src/alloc.c", directory: "/src")
!29 = !DILexicalBlockFile(scope: !20, file: !30, discriminator: 0)
!30 = !DIFile(filename: "app/secret.c", directory: "/src")
