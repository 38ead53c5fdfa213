/* A warp's tensor-core operations (ir/tensor_core.py) in PTX, m16n16k16, which codegen/cuda.py
   puts before the kernels that use them. A float16 tile of A or B is 8 registers of two halves a
   lane, the float32 accumulator 8 floats a lane, in an order the hardware keeps to itself.
   Addresses are generic, so a tile is read from global or shared memory alike; ldm is the
   elements between its rows (row major) or its columns (column major). */
#define TC_WMMA_LOAD(M, L)                                                                        \
  __device__ __forceinline__ void tc_wmma_load_##M##_##L(unsigned* f, const void* p, unsigned ldm) { \
    asm volatile("wmma.load." #M ".sync.aligned." #L ".m16n16k16.f16 "                            \
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"                                     \
                 : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3]),                                 \
                   "=r"(f[4]), "=r"(f[5]), "=r"(f[6]), "=r"(f[7])                                  \
                 : "l"(p), "r"(ldm) : "memory");                                                   \
  }                                                                                                \
  /* from shared memory: its own state space, so the loads are shared ones (ldmatrix) */          \
  __device__ __forceinline__ void tc_wmma_load_shared_##M##_##L(unsigned* f, const void* p, unsigned ldm) { \
    asm volatile("wmma.load." #M ".sync.aligned." #L ".m16n16k16.shared.f16 "                     \
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;"                                     \
                 : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3]),                                 \
                   "=r"(f[4]), "=r"(f[5]), "=r"(f[6]), "=r"(f[7])                                  \
                 : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(ldm) : "memory");               \
  }
TC_WMMA_LOAD(a, row) TC_WMMA_LOAD(a, col) TC_WMMA_LOAD(b, row) TC_WMMA_LOAD(b, col)

/* c += a b, in place */
#define TC_WMMA_MMA(A, B)                                                                          \
  __device__ __forceinline__ void tc_wmma_mma_##A##_##B(float* c, const unsigned* a, const unsigned* b) { \
    asm volatile("wmma.mma.sync.aligned." #A "." #B ".m16n16k16.f32.f32 "                          \
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11, %12, %13, %14, %15}, "      \
                 "{%16, %17, %18, %19, %20, %21, %22, %23}, {%0, %1, %2, %3, %4, %5, %6, %7};"     \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]),                                 \
                   "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7])                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]), "r"(a[6]),    \
                   "r"(a[7]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(b[4]), "r"(b[5]),    \
                   "r"(b[6]), "r"(b[7]));                                                          \
  }
TC_WMMA_MMA(row, row) TC_WMMA_MMA(row, col) TC_WMMA_MMA(col, row) TC_WMMA_MMA(col, col)

/* The accumulator into float32, or into a 16-bit float T (f16, bf16): each pair rounded to
   nearest even, element i of the 16-bit fragment element i of the float32 one, two a register
   (the first in the low half), stored with wmma's float16 store. */
#define TC_WMMA_STORE(L)                                                                           \
  __device__ __forceinline__ void tc_wmma_store_f32_##L(void* p, const float* c, unsigned ldm) {  \
    asm volatile("wmma.store.d.sync.aligned." #L ".m16n16k16.f32 "                                 \
                 "[%0], {%1, %2, %3, %4, %5, %6, %7, %8}, %9;"                                      \
                 :: "l"(p), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]),                            \
                    "f"(c[4]), "f"(c[5]), "f"(c[6]), "f"(c[7]), "r"(ldm) : "memory");              \
  }
#define TC_WMMA_STORE_16(T, L)                                                                     \
  __device__ __forceinline__ void tc_wmma_store_##T##_##L(void* p, const float* c, unsigned ldm) { \
    unsigned h[4];                                                                                 \
    for (int e = 0; e < 4; ++e)                                                                    \
      asm("cvt.rn." #T "x2.f32 %0, %1, %2;" : "=r"(h[e]) : "f"(c[2 * e + 1]), "f"(c[2 * e]));     \
    asm volatile("wmma.store.d.sync.aligned." #L ".m16n16k16.f16 [%0], {%1, %2, %3, %4}, %5;"    \
                 :: "l"(p), "r"(h[0]), "r"(h[1]), "r"(h[2]), "r"(h[3]), "r"(ldm) : "memory");      \
  }
TC_WMMA_STORE(row) TC_WMMA_STORE(col) TC_WMMA_STORE_16(f16, row) TC_WMMA_STORE_16(f16, col)

/* bfloat16, from sm_80 on: a tile of A or B is 4 registers of two bfloat16s a lane (a float16
   one is 8), multiplied into the same float32 accumulator. */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define TC_WMMA_LOAD_BF16(M, L)                                                                   \
  __device__ __forceinline__ void tc_wmma_load_bf16_##M##_##L(unsigned* f, const void* p, unsigned ldm) { \
    asm volatile("wmma.load." #M ".sync.aligned." #L ".m16n16k16.bf16 {%0, %1, %2, %3}, [%4], %5;"   \
                 : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3]) : "l"(p), "r"(ldm) : "memory");  \
  }                                                                                                \
  __device__ __forceinline__ void tc_wmma_load_shared_bf16_##M##_##L(unsigned* f, const void* p,   \
                                                                      unsigned ldm) {              \
    asm volatile("wmma.load." #M ".sync.aligned." #L ".m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;" \
                 : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])                                  \
                 : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(ldm) : "memory");               \
  }
TC_WMMA_LOAD_BF16(a, row) TC_WMMA_LOAD_BF16(a, col) TC_WMMA_LOAD_BF16(b, row) TC_WMMA_LOAD_BF16(b, col)

#define TC_WMMA_MMA_BF16(A, B)                                                                     \
  __device__ __forceinline__ void tc_wmma_mma_bf16_##A##_##B(float* c, const unsigned* a, const unsigned* b) { \
    asm volatile("wmma.mma.sync.aligned." #A "." #B ".m16n16k16.f32.bf16.bf16.f32 "                \
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, {%12, %13, %14, %15}, "    \
                 "{%0, %1, %2, %3, %4, %5, %6, %7};"                                               \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]),                                 \
                   "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7])                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3])); \
  }
TC_WMMA_MMA_BF16(row, row) TC_WMMA_MMA_BF16(row, col) TC_WMMA_MMA_BF16(col, row) TC_WMMA_MMA_BF16(col, col)

/* The accumulator into bfloat16, which wmma has no store of: TC_WMMA_STORE_16's rounding
   (cvt.rn.bf16x2.f32), its bits stored as a float16 fragment's, which a store moves as they are. */
TC_WMMA_STORE_16(bf16, row) TC_WMMA_STORE_16(bf16, col)
#endif
