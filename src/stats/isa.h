#pragma once
// Instruction-set variants, in one place. Every vector loop is written once with the compiler's
// portable vector types and compiled once per level; on x86-64 the levels are the psABI's
// micro-architecture levels, chosen at run time (src/stats/simd_level.cpp). Elsewhere (aarch64:
// Grace, GH200) only the portable variant runs, which the compiler turns into that CPU's own
// vectors (NEON); the other variants are compiled as portable code and never chosen.
#if defined(__x86_64__) || defined(__i386__)
#define SENTINEL_X86_LEVELS 1
#define SENTINEL_ISA_V4 __attribute__((target("arch=x86-64-v4"), noinline))
#define SENTINEL_ISA_V3 __attribute__((target("arch=x86-64-v3"), noinline))
#define SENTINEL_ISA_AVX2 __attribute__((target("avx2"), noinline))
#else
#define SENTINEL_X86_LEVELS 0
#define SENTINEL_ISA_V4 __attribute__((noinline))
#define SENTINEL_ISA_V3 __attribute__((noinline))
#define SENTINEL_ISA_AVX2 __attribute__((noinline))
#endif
#define SENTINEL_ISA_BASELINE __attribute__((noinline))
