// How many cycles some 512-bit instructions take on this core, relative to VMULPS (two a cycle):
// 12 independent chains each. gcc -O2 -o /tmp/t port_throughput.c && /tmp/t   (2026-11-30, the Xeon)
#include <stdio.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define M 50000000L
#define X12(S) S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11)
#define DECL(i) __m512 a##i=_mm512_set1_ps(1.0f+i); __m512i w##i=_mm512_set1_epi32(i); __m256i h##i=_mm256_set1_epi32(i);
#define SINK(i) s=_mm512_add_ps(s,a##i); t=_mm512_xor_si512(t,w##i); u=_mm256_xor_si256(u,h##i);
#define RUN(name, S) { double t0=now(); for(long i=0;i<M;i++){ X12(S) } double t1=now(); printf("%-28s %.2f rel (vmulps=1 per 2 ports)\n", name, (t1-t0)/(12.0*M)/base); }
#define MUL(i) a##i=_mm512_mul_ps(a##i,b);
#define CVT2(i) w##i=(__m512i)_mm512_cvtne2ps_pbh(b,(__m512)w##i);
#define CVT1(i) h##i=(__m256i)_mm512_cvtneps_pbh((__m512)_mm512_castsi256_si512(h##i));
#define PT2W(i) w##i=_mm512_permutex2var_epi16(w##i,idx,t0v);
#define PERM(i) w##i=_mm512_permutexvar_epi16(idx,w##i);
__attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16,avx512vl")))
int main(){
  X12(DECL)
  __m512 b=_mm512_set1_ps(1.0000001f); __m512i idx=_mm512_set1_epi16(3), t0v=_mm512_set1_epi16(7);
  double base=1;
  { double t0=now(); for(long i=0;i<M;i++){ X12(MUL) } double t1=now(); base=(t1-t0)/(12.0*M); }
  RUN("vmulps", MUL)
  RUN("vcvtne2ps2bf16 zmm", CVT2)
  RUN("vcvtneps2bf16 zmm->ymm", CVT1)
  RUN("vpermt2w zmm", PT2W)
  RUN("vpermw zmm", PERM)
  __m512 s=_mm512_setzero_ps(); __m512i t=_mm512_setzero_si512(); __m256i u=_mm256_setzero_si256(); X12(SINK)
  float o[16]; _mm512_storeu_ps(o,_mm512_add_ps(s,_mm512_add_ps((__m512)t,(__m512)_mm512_castsi256_si512(u)))); printf("%f\n",o[0]);
}
