// The bf16 GPT-J RoPE step of RotateBF16Wide alone, on a 10 KiB tensor in L1, with parts taken out:
// where its cycles go. gcc -O2 -o /tmp/t loop_anatomy.c && /tmp/t   (2026-11-30, the Xeon; 4 GHz: port_throughput's VMULPS)
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define T __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16,avx512vl"),noinline))
// GPT-J step over n elements of x (bf16), tables c,n (16 floats, one token) - variant bits
T long run(uint16_t* x, const float* c, const float* nn, long elems, int reps, int variant) {
  const __m512i order = _mm512_set_epi16(31,15,30,14,29,13,28,12,27,11,26,10,25,9,24,8,23,7,22,6,21,5,20,4,19,3,18,2,17,1,16,0);
  const __m512 bs=_mm512_set1_ps(0x1p-12f); long slow=0;
  for (int r=0;r<reps;r++) for (long e=0;e<elems;e+=32) {
    long k=(e/2)&63;
    __m512i w=_mm512_loadu_si512(x+e);
    __m512 u=_mm512_castsi512_ps(_mm512_slli_epi32(w,16)), v=_mm512_castsi512_ps(_mm512_and_si512(w,_mm512_set1_epi32(0xffff0000)));
    __m512 ck=_mm512_loadu_ps(c+k), nk=_mm512_loadu_ps(nn+k);
    __m512 a=_mm512_sub_ps(_mm512_mul_ps(u,ck),_mm512_mul_ps(v,nk));
    __m512 b=_mm512_add_ps(_mm512_mul_ps(v,ck),_mm512_mul_ps(u,nk));
    if (!(variant&1)) {
      __m512 sum=_mm512_add_ps(_mm512_abs_ps(u),_mm512_abs_ps(v));
      __m512 bound=_mm512_mul_ps(bs,sum);
      __m512 m=_mm512_range_ps(a,b,0x0a);
      __mmask16 odd=_mm512_fpclass_ps_mask(m,0xb9), low=_mm512_cmp_ps_mask(m,bound,_CMP_NGE_UQ);
      if (variant&4) { __mmask16 bb=_kor_mask16(odd,low); __asm__ volatile(""::"k"(bb)); }
      else if (__builtin_expect(!_kortestz_mask16_u8(odd,low),0)) slow++;
    }
    __m512i out;
    if (variant&2) out=_mm512_castps_si512(_mm512_add_ps(a,b));
    else out=_mm512_permutexvar_epi16(order,(__m512i)_mm512_cvtne2ps_pbh(b,a));
    _mm512_storeu_si512(x+e,out);
  }
  return slow;
}
int main(){
  static uint16_t x[5120] __attribute__((aligned(64))); static float c[128] __attribute__((aligned(64))), n[128] __attribute__((aligned(64)));
  for(int i=0;i<5120;i++) x[i]=0x3f80 + (i*37)%100; for(int i=0;i<128;i++){c[i]=0.6f;n[i]=0.8f;}
  const char* names[]={"full","no test","no narrowing","neither","test w/o branch","",""};
  int vs[]={0,1,2,3,4};
  for(int vi=0;vi<5;vi++){ int v=vs[vi]; long reps=200000; double t0=now(); long s=run(x,c,n,5120,reps,v); double t1=now();
    double steps=reps*5120.0/32; printf("%-18s %.2f ns/step  %.1f cycles@4GHz  (%.1f GB/s rw)  slow %ld\n",names[vi],(t1-t0)/steps*1e9,(t1-t0)/steps*4e9, steps*128/(t1-t0)/1e9, s);
    for(int i=0;i<5120;i++) x[i]=0x3f80 + (i*37)%100; }
}
