// Which ports VCVTNE2PS2BF16 shares: it paired with VPERMW (port 5), VPSLLD (port 0), VMULPS/VADDPS (0 and 5).
// gcc -O2 -o /tmp/t port_pairs.c && /tmp/t   (2026-11-30, the Xeon)
#include <stdio.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define M 50000000L
#define X12(S) S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11)
#define DECL(i) __m512 a##i=_mm512_set1_ps(1.0f+i); __m512i w##i=_mm512_set1_epi32(i); __m512i p##i=_mm512_set1_epi32(i);
#define SINK(i) s=_mm512_add_ps(s,a##i); t=_mm512_xor_si512(t,_mm512_xor_si512(w##i,p##i));
#define RUN(name, S) { double t0=now(); for(long i=0;i<M;i++){ X12(S) } double t1=now(); printf("%-34s %.2f (vmulps pair = 1)\n", name, (t1-t0)/(12.0*M)/base); }
#define MUL(i) a##i=_mm512_mul_ps(a##i,b);
#define CVT2(i) w##i=(__m512i)_mm512_cvtne2ps_pbh(b,(__m512)w##i);
#define CVTPERM(i) w##i=(__m512i)_mm512_cvtne2ps_pbh(b,(__m512)w##i); p##i=_mm512_permutexvar_epi16(idx,p##i);
#define CVTSLL(i) w##i=(__m512i)_mm512_cvtne2ps_pbh(b,(__m512)w##i); p##i=_mm512_slli_epi32(p##i,1);
#define CVTMUL(i) w##i=(__m512i)_mm512_cvtne2ps_pbh(b,(__m512)w##i); a##i=_mm512_mul_ps(a##i,b);
#define CVTMUL2(i) w##i=(__m512i)_mm512_cvtne2ps_pbh(b,(__m512)w##i); a##i=_mm512_mul_ps(a##i,b); a##i=_mm512_add_ps(a##i,b);
__attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16,avx512vl")))
int main(){
  X12(DECL)
  __m512 b=_mm512_set1_ps(1.0000001f); __m512i idx=_mm512_set1_epi16(3);
  double base=1;
  { double t0=now(); for(long i=0;i<M;i++){ X12(MUL) } double t1=now(); base=(t1-t0)/(12.0*M); }
  RUN("cvt", CVT2)
  RUN("cvt + vpermw", CVTPERM)
  RUN("cvt + vpslld", CVTSLL)
  RUN("cvt + vmulps", CVTMUL)
  RUN("cvt + vmulps + vaddps", CVTMUL2)
  __m512 s=_mm512_setzero_ps(); __m512i t=_mm512_setzero_si512(); X12(SINK)
  float o[16]; _mm512_storeu_ps(o,_mm512_add_ps(s,(__m512)t)); printf("%f\n",o[0]);
}
