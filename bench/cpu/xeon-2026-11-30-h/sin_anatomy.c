// The bf16 sinusoidal add step of FusedRangeBF16Wide (INTERLEAVED, unscaled) alone, x and tables in L1,
// with parts taken out. gcc -O2 -o /tmp/t sin_anatomy.c && /tmp/t   (2026-11-30 night, the Xeon; 4 GHz)
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define T __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16,avx512vl"),noinline))
T long run(uint16_t* y, const float* a, const float* b, const float* tc, const float* ts, long freqs, int reps, int variant) {
  const __m512i order = _mm512_set_epi16(31,15,30,14,29,13,28,12,27,11,26,10,25,9,24,8,23,7,22,6,21,5,20,4,19,3,18,2,17,1,16,0);
  const __m512 safe=_mm512_set1_ps(0x1p-10f); long slow=0;
  for (int r=0;r<reps;r++) for (long i=0;i<freqs;i+=16) {
    __m512i w=_mm512_loadu_si512(y+2*i);
    __m512 u=_mm512_castsi512_ps(_mm512_slli_epi32(w,16)), v=_mm512_castsi512_ps(_mm512_and_si512(w,_mm512_set1_epi32(0xffff0000)));
    __m512 as=_mm512_loadu_ps(a+i), ac=_mm512_loadu_ps(b+i), oc=_mm512_loadu_ps(tc+i), os=_mm512_loadu_ps(ts+i);
    __m512 pe_s=_mm512_add_ps(_mm512_mul_ps(as,oc),_mm512_mul_ps(ac,os));
    __m512 pe_c=_mm512_sub_ps(_mm512_mul_ps(ac,oc),_mm512_mul_ps(as,os));
    if (variant&8) { pe_s=as; pe_c=ac; }
    __m512 rs=_mm512_add_ps(u,pe_s), rc=_mm512_add_ps(v,pe_c);
    if (!(variant&1)) {
      __m512 m=_mm512_range_ps(rs,rc,0x0a);
      __mmask16 ok=_mm512_cmp_ps_mask(m,safe,_CMP_GE_OQ);
      if (__builtin_expect(!_kortestc_mask16_u8(ok,ok),0)) slow++;
    }
    __m512i out;
    if (variant&2) out=_mm512_castps_si512(_mm512_add_ps(rs,rc));
    else if (variant&4) out=(__m512i)_mm512_cvtne2ps_pbh(rc,rs);
    else out=_mm512_permutexvar_epi16(order,(__m512i)_mm512_cvtne2ps_pbh(rc,rs));
    _mm512_storeu_si512(y+2*i,out);
  }
  return slow;
}
int main(){
  enum {F=1024};
  static uint16_t y[2*F] __attribute__((aligned(64))); static float a[F],b[F],tc[F],ts[F] __attribute__((aligned(64)));
  for(int i=0;i<F;i++){a[i]=0.6f;b[i]=0.8f;tc[i]=0.6f;ts[i]=0.8f;}
  const char* names[]={"full","no test","no narrowing","neither","narrowing w/o VPERMW","","","","no rotation (2 tables)","","","no rotation, neither"};
  int vs[]={0,1,2,3,4,8,11};
  for(int vi=0;vi<7;vi++){ int v=vs[vi]; long reps=400000;
    for(int i=0;i<2*F;i++) y[i]=0x3f80 + (i*37)%100;
    double t0=now(); long s=run(y,a,b,tc,ts,F,reps,v); double t1=now();
    double steps=reps*(double)F/16; printf("%-24s %.2f ns/step  %.1f cycles@4GHz  slow %ld\n",names[v],(t1-t0)/steps*1e9,(t1-t0)/steps*4e9, s);
  }
}
