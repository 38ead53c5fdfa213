/* CUDA on a CPU: enough of CUDA C++ for the kernels codegen/cuda.py writes to run here, as
   written, so that the code generator's own text is checked against NumPy where there is no
   GPU (runtime/cuda_on_cpu.py compiles it with this header in place of the CUDA prelude).

   A block's threads are fibers on one OS thread, run in an order the caller picks.
   Each runs until it must wait: at __syncthreads() until every thread of the block arrives, at
   a warp's collective operation (a shuffle, a wmma operation) until every lane it names does.
   Everything a GPU leaves undefined is made visible: shared memory, outputs and workspace start
   as 0xff bytes (a float NaN), cp.async copies land only when a wait_group requires them, and
   a thread that waits where the others never come, a wmma operand loaded in another layout or
   misaligned, a shared-memory load from global memory, or a shuffle outside its mask ends the
   run with a message naming the block and thread. AddressSanitizer (the compiler's flags)
   catches reads and writes outside the arguments, UBSan misaligned vector accesses; or, for a
   racecheck, ThreadSanitizer the threads' data races (below). */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif
/* Under ThreadSanitizer (racecheck), each thread of each block is a fiber of its own to it,
   switches order nothing, and only what orders threads on a GPU orders them here: the barriers
   and a warp's meetings (each thread releasing as it arrives and acquiring as it leaves),
   atomics, and the end of a launch before the next. Two threads touching one address between
   those, one of them writing, are a race whichever order they ran in, as compute-sanitizer's
   racecheck says; in two blocks too (their outputs overlapping, a sum split across blocks
   added without atomics), since nothing orders blocks but blocks of one colour (``COLOURS``).
   What blocks only seem to share, being run one after another here (the shared arrays, the
   barriers' and meetings' sync objects), is new to it at each block's start: the sync objects
   new on the heap, the shared arrays made new as its interface for Java heaps allows
   (``renew``; its annotation for new memory does nothing). */
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
extern "C" void __tsan_java_init(uintptr_t heap_begin, uintptr_t heap_size);
extern "C" void __tsan_java_alloc(uintptr_t address, uintptr_t bytes);
extern "C" void __tsan_java_free(uintptr_t address, uintptr_t bytes);
#define TC_TSAN(...) __VA_ARGS__
#else
#define TC_TSAN(...)
#endif
/* The runtime's own bookkeeping (who waits, who runs), which no barrier orders: not watched */
#define TC_UNRACED __attribute__((no_sanitize("thread")))

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* A block's static shared arrays: one copy (blocks run one after another), in a section of
   their own so that each block's start can fill them with 0xff. */
#define __shared__ static __attribute__((section("tc_shared")))
extern "C" char __start_tc_shared[] __attribute__((weak));
extern "C" char __stop_tc_shared[] __attribute__((weak));
#define TC_DYNAMIC_SHARED unsigned char* tc_shared = tc_cpu::dynamic_shared

/* The C backend's bfloat16 conversions, which the program defines after this header (its
   helpers come with the kernels): the wmma stores round as the kernels do. */
static inline float tc_bf2f(uint16_t h);
static inline uint16_t tc_f2bf(float f);

struct dim3 { unsigned x, y, z; };
#define TC_VECTOR2(T, N, A) struct alignas(A) N { T x, y; }; inline N make_##N(T x, T y) { return N{x, y}; }
#define TC_VECTOR4(T, N, A) struct alignas(A) N { T x, y, z, w; }; \
  inline N make_##N(T x, T y, T z, T w) { return N{x, y, z, w}; }
TC_VECTOR2(float, float2, 8) TC_VECTOR4(float, float4, 16) TC_VECTOR2(int, int2, 8) TC_VECTOR4(int, int4, 16)
TC_VECTOR2(double, double2, 16) TC_VECTOR2(unsigned, uint2, 8) TC_VECTOR4(unsigned, uint4, 16)
/* what sm_90's atomicAdd of float2 and float4 adds */
inline float2 operator+(float2 a, float2 b) { return float2{a.x + b.x, a.y + b.y}; }
inline float4 operator+(float4 a, float4 b) { return float4{a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w}; }

namespace tc_cpu {

const size_t STACK_BYTES = 256 << 10;
/* Under ThreadSanitizer, the blocks of a launch are coloured as a checkerboard: a block's threads
   are the fibers (and stacks) of its colour, so that blocks next to each other along any axis
   are threads apart to it, never ordered (what one block's threads did, the same thread of the
   next block of its colour follows in program order: those two blocks are not checked) */
#if defined(__SANITIZE_THREAD__)
const int COLOURS = 2;
#else
const int COLOURS = 1;
#endif

/* A fiber's saved state, and the switch between two: on x86-64 six registers and the stack
   pointer, what the ABI keeps across a call (swapcontext also saves the signal mask, a system
   call that made each switch cost a microsecond); elsewhere ucontext. */
#if defined(__x86_64__)
extern "C" void tc_switch(void** save, void* load);
asm(R"(
  .text
  .globl tc_switch
  .type tc_switch, @function
tc_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
)");
struct Context { void* sp = nullptr; };
TC_UNRACED inline void start(Context& context, char* stack, size_t bytes, void (*entry)()) {
  void** top = (void**)((uintptr_t)(stack + bytes) & ~(uintptr_t)15);
  top[-1] = nullptr;          // the return address entry never uses: it enters 8 bytes off 16, as a call does
  top[-2] = (void*)entry;     // where the first switch returns to
  for (int n = 3; n <= 8; ++n) top[-n] = nullptr;  // the six registers it pops
  context.sp = top - 8;
}
TC_UNRACED inline void swap(Context& from, Context& to) { tc_switch(&from.sp, to.sp); }
#else
#include <ucontext.h>
struct Context { ucontext_t uc; };
TC_UNRACED inline void start(Context& context, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&context.uc);
  context.uc.uc_stack.ss_sp = stack;
  context.uc.uc_stack.ss_size = bytes;
  context.uc.uc_link = nullptr;
  makecontext(&context.uc, entry, 0);
}
TC_UNRACED inline void swap(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

struct Copy { void* dst; const void* src; int bytes, read, group; };

struct Fiber {
  Context context;
  dim3 index;
  int linear = 0;
  bool done = false, waiting = false;
  const char* waits_at = "";
  char* stack = nullptr;
  Copy* copies = nullptr;  // cp.async copies in the order issued, landed up to ``landed``
  int issued = 0, capacity = 0, landed = 0, committed = 0;  // ``committed``: the groups closed so far
  void* race_fiber = nullptr;  // ThreadSanitizer's, of the block's colour (``launch``)
  char* stacks[COLOURS] = {};
  void* race_fibers[COLOURS] = {};
};

struct Warp {
  unsigned arrived = 0, mask = 0, meetings = 0;
  char meeting[2];  // the ThreadSanitizer sync object of a meeting, by its parity
  uint64_t slots[32];
  float a[256], b[256];  // a wmma.mma's A and B, gathered from the lanes
};

inline Context scheduler;
inline Fiber* current = nullptr;
inline Fiber* fibers = nullptr;
inline Warp* warps = nullptr;
inline int threads = 0, block_arrived = 0;
inline unsigned barriers = 0;  // the block's barriers passed so far
/* ThreadSanitizer's sync objects: a barrier's, by its parity (a block's own, on the heap: freed,
   it is forgotten); launch_start, which the scheduler releases as a launch starts and each
   thread acquires as it starts; launch_end, which each thread releases as it returns and the
   scheduler acquires as the launch ends */
inline char* barrier = nullptr;
inline char launch_start, launch_end;
inline void* scheduler_race_fiber = nullptr;
inline dim3 block_index, block_dim, grid_dim;
inline void (*body)(void**) = nullptr;  // the kernel, called with its arguments
inline void** arguments = nullptr;
inline unsigned char* dynamic_shared = nullptr;
inline size_t dynamic_shared_bytes = 0;
#if defined(__SANITIZE_ADDRESS__)
inline const void* scheduler_stack = nullptr;
inline size_t scheduler_stack_bytes = 0;
#endif

/* An argument, as whatever pointer type the kernel's parameter is. */
struct Arg {
  void* p;
  template <class T> operator T*() const { return (T*)p; }
};

[[noreturn]] TC_UNRACED inline void fail(const char* format, ...) {
  fprintf(stderr, "block (%u, %u, %u)", block_index.x, block_index.y, block_index.z);
  if (current) fprintf(stderr, " thread (%u, %u, %u)", current->index.x, current->index.y, current->index.z);
  fprintf(stderr, ": ");
  va_list args;
  va_start(args, format);
  vfprintf(stderr, format, args);
  va_end(args);
  fprintf(stderr, "\n");
  fflush(stderr);
  _Exit(3);
}

TC_UNRACED inline void to_scheduler(bool finished) {
  TC_TSAN(__tsan_switch_to_fiber(scheduler_race_fiber, __tsan_switch_to_fiber_no_sync);)
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(finished ? nullptr : &fake, scheduler_stack, scheduler_stack_bytes);
  swap(current->context, scheduler);
  __sanitizer_finish_switch_fiber(fake, &scheduler_stack, &scheduler_stack_bytes);  // the stack it came from
#else
  (void)finished;
  swap(current->context, scheduler);
#endif
}

TC_UNRACED inline void to_fiber(Fiber& fiber) {
  current = &fiber;
  TC_TSAN(__tsan_switch_to_fiber(fiber.race_fiber, __tsan_switch_to_fiber_no_sync);)
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, fiber.stack, STACK_BYTES);
  swap(scheduler, fiber.context);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  swap(scheduler, fiber.context);
#endif
  current = nullptr;
}

TC_UNRACED inline void fiber_main() {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack, &scheduler_stack_bytes);
#endif
  TC_TSAN(__tsan_acquire(&launch_start);)
  body(arguments);  // copies never waited for never land: only the block's threads could have read them
  TC_TSAN(__tsan_release(&launch_end);)
  current->done = true;
  to_scheduler(true);
}

TC_UNRACED inline void wait(const char* where) {
  current->waiting = true;
  current->waits_at = where;
  to_scheduler(false);
}

TC_UNRACED inline bool in_shared(const void* p) {
  const char* c = (const char*)p;
  return (c >= __start_tc_shared && c < __stop_tc_shared) ||
         (c >= (const char*)dynamic_shared && c < (const char*)dynamic_shared + dynamic_shared_bytes);
}

#if defined(__SANITIZE_THREAD__)
/* ``bytes`` at ``memory`` new to ThreadSanitizer, whoever touched them before: the address space
   from the program's image up is its Java heap, whose allocations it takes as new memory, each
   freed at once (what that frees is its record of the block and the sync objects inside, not
   what the shadow says) so that a report names the memory as before, a shared array. A report
   looks for the Java block around an address outside malloc's memory back to the heap's start:
   from the image, not from 0, that is quick. */
extern "C" char __executable_start[];
TC_UNRACED inline void renew(const void* memory, size_t bytes) {
  static const uintptr_t heap = (uintptr_t)__executable_start & ~(uintptr_t)4095;
  static bool java = (__tsan_java_init(heap, ((uintptr_t)1 << 47) - heap), true);
  uintptr_t begin = (uintptr_t)memory & ~(uintptr_t)7, end = ((uintptr_t)memory + bytes + 7) & ~(uintptr_t)7;
  if (java && bytes) __tsan_java_alloc(begin, end - begin), __tsan_java_free(begin, end - begin);
}

TC_UNRACED inline void renew_shared() {
  renew(__start_tc_shared, __stop_tc_shared - __start_tc_shared);
  renew(dynamic_shared, dynamic_shared_bytes);
}
#endif

/* Every thread of the block, in ``order``, until all have returned. */
TC_UNRACED inline void run_block(const int* order) {
  for (int n = 0; n < threads; ++n) {
    Fiber& fiber = fibers[n];
    fiber.done = fiber.waiting = false;
    fiber.issued = fiber.landed = fiber.committed = 0;
    start(fiber.context, fiber.stack, STACK_BYTES, fiber_main);
  }
  TC_TSAN(renew_shared();)  // the last block's accesses forgotten, so that the fill races with none
  if (__start_tc_shared) memset(__start_tc_shared, 0xff, __stop_tc_shared - __start_tc_shared);
  if (dynamic_shared) memset(dynamic_shared, 0xff, dynamic_shared_bytes);
  TC_TSAN(renew_shared();)  // and the fill's
  block_arrived = 0;
  for (;;) {
    int ran = 0, done = 0;
    for (int n = 0; n < threads; ++n) {
      Fiber& fiber = fibers[order[n]];
      if (fiber.done) ++done;
      else if (!fiber.waiting) to_fiber(fiber), ++ran;
    }
    if (done == threads) return;
    if (ran) continue;
    for (int n = 0; n < threads; ++n)
      if (fibers[n].waiting) {
        current = &fibers[n];
        fail("waits at %s for threads that never come: %d of the block's %d threads returned without it",
             current->waits_at, done, threads);
      }
  }
}

/* A grid of blocks, each block's threads run in the order ``seed`` picks: 0 in order, 1
   reversed, larger a shuffle (xorshift) of each block's. */
TC_UNRACED inline void launch(dim3 grid, dim3 block, size_t shared_bytes, unsigned seed, void (*kernel)(void**), void** args) {
  threads = (int)(block.x * block.y * block.z);
  fibers = new Fiber[threads];
  char* stacks = (char*)malloc((size_t)COLOURS * threads * STACK_BYTES);
  int* order = new int[threads];
  for (int n = 0; n < threads; ++n) {
    for (int colour = 0; colour < COLOURS; ++colour) {
      fibers[n].stacks[colour] = stacks + ((size_t)colour * threads + n) * STACK_BYTES;
      TC_TSAN(fibers[n].race_fibers[colour] = __tsan_create_fiber(0);)
    }
    fibers[n].linear = n;
    fibers[n].index = dim3{(unsigned)n % block.x, (unsigned)n / block.x % block.y, (unsigned)n / (block.x * block.y)};
    order[n] = seed == 1 ? threads - 1 - n : n;
  }
  TC_TSAN(scheduler_race_fiber = __tsan_get_current_fiber();
          __tsan_release(&launch_start);)
  dynamic_shared = shared_bytes ? (unsigned char*)malloc(shared_bytes) : nullptr;
  dynamic_shared_bytes = shared_bytes;
  body = kernel, arguments = args;
  block_dim = block, grid_dim = grid;
  unsigned random = seed;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        block_index = dim3{x, y, z};
        for (int n = threads - 1; seed > 1 && n > 0; --n) {
          random ^= random << 13, random ^= random >> 17, random ^= random << 5;
          int other = (int)(random % (unsigned)(n + 1)), kept = order[n];
          order[n] = order[other], order[other] = kept;
        }
        warps = new Warp[(threads + 31) / 32];  // its sync objects new, as the barrier's
        barrier = new char[2];
        for (int n = 0; n < threads; ++n) {
          fibers[n].stack = fibers[n].stacks[(x + y + z) % COLOURS];
          fibers[n].race_fiber = fibers[n].race_fibers[(x + y + z) % COLOURS];
        }
        run_block(order);
        delete[] warps;
        delete[] barrier;
      }
  TC_TSAN(__tsan_acquire(&launch_end);)
  for (int n = 0; n < threads; ++n) {
    free(fibers[n].copies);
    TC_TSAN(for (void* race_fiber : fibers[n].race_fibers) __tsan_destroy_fiber(race_fiber);)
  }
  delete[] fibers;
  delete[] order;
  free(stacks);
  free(dynamic_shared);
  dynamic_shared = nullptr;
}

TC_UNRACED inline void syncthreads() {
  char* sync = &barrier[barriers % 2];  // a thread that has left may arrive at the next before the others leave
  TC_TSAN(__tsan_release(sync);)
  if (++block_arrived == threads) {
    block_arrived = 0;
    ++barriers;
    for (int n = 0; n < threads; ++n) fibers[n].waiting = false;
  } else {
    wait("__syncthreads()");
  }
  TC_TSAN(__tsan_acquire(sync);)
}

/* Every lane of ``mask`` meets here; the calling lane must be one of them. */
TC_UNRACED inline void warp_sync(unsigned mask, const char* what) {
  int lane = current->linear % 32;
  Warp& warp = warps[current->linear / 32];
  if (!(mask >> lane & 1)) fail("%s with mask %#x, which leaves out the calling lane %d", what, mask, lane);
  if (warp.arrived && warp.mask != mask) fail("%s with mask %#x where other lanes gave %#x", what, mask, warp.mask);
  warp.mask = mask;
  warp.arrived |= 1u << lane;
  char* sync = &warp.meeting[warp.meetings % 2];
  TC_TSAN(__tsan_release(sync);)
  if (warp.arrived == mask) {
    warp.arrived = 0;
    ++warp.meetings;
    for (int n = 0; n < 32; ++n)
      if (mask >> n & 1) fibers[current->linear / 32 * 32 + n].waiting = false;
  } else {
    wait(what);
  }
  TC_TSAN(__tsan_acquire(sync);)
}

template <class T> TC_UNRACED T shfl_xor(unsigned mask, T value, int lane_mask, int width) {
  int lane = current->linear % 32, source = lane ^ lane_mask;
  Warp& warp = warps[current->linear / 32];
  if (source >= (lane / width + 1) * width) source = lane;  // beyond its group of width lanes: its own
  memcpy(&warp.slots[lane], &value, sizeof(T));
  warp_sync(mask, "__shfl_xor_sync");
  if (!(mask >> source & 1)) fail("__shfl_xor_sync reads lane %d, outside its mask %#x", source, mask);
  T result;
  memcpy(&result, &warp.slots[source], sizeof(T));
  warp_sync(mask, "__shfl_xor_sync");
  return result;
}

TC_UNRACED inline void copy_async(void* dst, const void* src, int bytes, int read) {
  if (!in_shared(dst)) fail("cp.async into %p, which is not shared memory", dst);
  if ((uintptr_t)dst % bytes || (uintptr_t)src % bytes) fail("cp.async of %d bytes from %p to %p, misaligned", bytes,
                                                              src, dst);
  if (read != 0 && read != bytes) fail("cp.async reads %d of %d bytes", read, bytes);
  Fiber& fiber = *current;
  if (fiber.issued == fiber.capacity) {
    fiber.capacity = fiber.capacity ? 2 * fiber.capacity : 64;
    fiber.copies = (Copy*)realloc(fiber.copies, fiber.capacity * sizeof(Copy));
  }
  fiber.copies[fiber.issued++] = Copy{dst, src, bytes, read, fiber.committed};
}

/* The copies issued since the last commit a group; those of all but the ``pending`` latest groups land. */
TC_UNRACED inline void commit_and_wait(int pending) {
  Fiber& fiber = *current;
  ++fiber.committed;
  for (; fiber.landed < fiber.issued && fiber.copies[fiber.landed].group < fiber.committed - pending; ++fiber.landed) {
    const Copy& copy = fiber.copies[fiber.landed];
    if (copy.read) memcpy(copy.dst, copy.src, copy.bytes);
    else memset(copy.dst, 0, copy.bytes);
  }
}

/* wmma, m16n16k16. A lane holds 8 elements of a 16x16 tile, row major, lane l the l-th 8 (of
   A or B: four registers of two 16-bit elements, the fifth naming the operand, its layout and
   type, which the mma checks against its own); the float32 accumulator 8 floats. */
enum Operand { A = 1, B = 2 };
enum Layout { ROW = 1, COL = 2 };
enum Type { F32 = 0, F16 = 1, BF16 = 2 };
const unsigned TAG = 0x7c000000u;
const char* const LAYOUTS[] = {"?", "row", "col"};

inline float widen(uint16_t bits, int type) {
  if (type == BF16) return tc_bf2f(bits);
  _Float16 h; memcpy(&h, &bits, 2); return (float)h;
}

inline uint16_t round_to(float value, int type) {
  if (type == BF16) return tc_f2bf(value);
  _Float16 h = (_Float16)value; uint16_t bits; memcpy(&bits, &h, 2); return bits;
}

/* The offset of a tile's element (row, column) in memory of leading dimension ldm. */
inline unsigned at(int layout, int row, int column, unsigned ldm) {
  return layout == ROW ? row * ldm + column : column * ldm + row;
}

TC_UNRACED inline void check_tile(const char* what, const void* p, unsigned ldm, int element_bytes) {
  if ((uintptr_t)p % 32) fail("%s at %p, which is not 32-byte aligned", what, p);
  if (ldm * element_bytes % 16) fail("%s with ldm %u, not a multiple of 16 bytes", what, ldm);
}

/* A lane's share of a tile read or written: the kernel's memory, which a racecheck watches. */
inline void read_tile(unsigned* fragment, const uint16_t* m, unsigned ldm, int layout, int lane) {
  for (int e = 0; e < 8; e += 2) {
    int n = lane * 8 + e;
    unsigned low = m[at(layout, n / 16, n % 16, ldm)], high = m[at(layout, (n + 1) / 16, (n + 1) % 16, ldm)];
    fragment[e / 2] = low | high << 16;
  }
}

inline void write_tile(void* p, const float* c, unsigned ldm, int layout, int type, int lane) {
  for (int e = 0; e < 8; ++e) {
    unsigned offset = at(layout, (lane * 8 + e) / 16, (lane * 8 + e) % 16, ldm);
    if (type == F32) ((float*)p)[offset] = c[e];
    else ((uint16_t*)p)[offset] = round_to(c[e], type);
  }
}

TC_UNRACED inline void load(unsigned* fragment, const void* p, unsigned ldm, int operand, int layout, int type, bool shared) {
  check_tile("wmma.load", p, ldm, 2);
  if (shared != in_shared(p)) fail("wmma.load%s from %p, which is %sshared memory", shared ? ".shared" : "", p,
                                   shared ? "not " : "");
  warp_sync(0xffffffffu, "wmma.load");
  read_tile(fragment, (const uint16_t*)p, ldm, layout, current->linear % 32);
  fragment[4] = TAG | operand << 8 | layout << 4 | type;
}

TC_UNRACED inline void gather(float* into, const unsigned* fragment, int operand, int layout, int type) {
  if (fragment[4] != (TAG | operand << 8 | layout << 4 | type))
    fail("wmma.mma takes %c as %s-major %s, but its fragment (tag %#x) was not loaded so", operand == A ? 'A' : 'B',
         LAYOUTS[layout], type == BF16 ? "bf16" : "f16", fragment[4]);
  int lane = current->linear % 32;
  for (int e = 0; e < 8; ++e) into[lane * 8 + e] = widen((uint16_t)(fragment[e / 2] >> (e % 2 * 16)), type);
}

TC_UNRACED inline void mma(float* c, const unsigned* a, const unsigned* b, int a_layout, int b_layout, int type) {
  Warp& warp = warps[current->linear / 32];
  gather(warp.a, a, A, a_layout, type);
  gather(warp.b, b, B, b_layout, type);
  warp_sync(0xffffffffu, "wmma.mma");
  int lane = current->linear % 32;
  for (int e = 0; e < 8; ++e) {
    int row = (lane * 8 + e) / 16, column = (lane * 8 + e) % 16;
    float sum = c[e];
    for (int k = 0; k < 16; ++k) sum += warp.a[row * 16 + k] * warp.b[k * 16 + column];
    c[e] = sum;
  }
  warp_sync(0xffffffffu, "wmma.mma");
}

TC_UNRACED inline void store(void* p, const float* c, unsigned ldm, int layout, int type) {
  check_tile("wmma.store", p, ldm, type == F32 ? 4 : 2);
  warp_sync(0xffffffffu, "wmma.store");
  write_tile(p, c, ldm, layout, type, current->linear % 32);
}

TC_UNRACED inline dim3 thread_index() { return current->index; }
TC_UNRACED inline dim3 block_index_() { return block_index; }
}  // namespace tc_cpu
#define threadIdx (tc_cpu::thread_index())
#define blockIdx (tc_cpu::block_index_())
#define blockDim (tc_cpu::block_dim)
#define gridDim (tc_cpu::grid_dim)
inline void __syncthreads() { tc_cpu::syncthreads(); }
template <class T> T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  return tc_cpu::shfl_xor(mask, value, lane_mask, width);
}
template <class T> T atomicAdd(T* address, T value) {
  TC_TSAN(__tsan_acquire(address);)
  T old = *address;
  *address = old + value;
  TC_TSAN(__tsan_release(address);)
  return old;
}

inline float tc_h2f(unsigned short h) { return tc_cpu::widen(h, tc_cpu::F16); }
inline unsigned short tc_f2h(float f) { return tc_cpu::round_to(f, tc_cpu::F16); }

#define TC_CP_ASYNC(level, bytes, dst, src) tc_cpu::copy_async(dst, src, bytes, bytes)
#define TC_CP_ASYNC_ZFILL(level, bytes, dst, src, read) tc_cpu::copy_async(dst, src, bytes, read)
#define TC_CP_ASYNC_WAIT(pending) tc_cpu::commit_and_wait(pending)

/* wmma.cuh's functions, by the names codegen/cuda.py calls */
#define TC_CPU_LOAD(SPACE, KIND, M, L, SHARED, TYPE, OPERAND, LAYOUT)                                   \
  inline void tc_wmma_load_##SPACE##KIND##M##_##L(unsigned* f, const void* p, unsigned ldm) {          \
    tc_cpu::load(f, p, ldm, tc_cpu::OPERAND, tc_cpu::LAYOUT, tc_cpu::TYPE, SHARED);                    \
  }
#define TC_CPU_LOADS(SPACE, SHARED, KIND, TYPE)                                                         \
  TC_CPU_LOAD(SPACE, KIND, a, row, SHARED, TYPE, A, ROW) TC_CPU_LOAD(SPACE, KIND, a, col, SHARED, TYPE, A, COL) \
  TC_CPU_LOAD(SPACE, KIND, b, row, SHARED, TYPE, B, ROW) TC_CPU_LOAD(SPACE, KIND, b, col, SHARED, TYPE, B, COL)
TC_CPU_LOADS(, false, , F16) TC_CPU_LOADS(shared_, true, , F16)
TC_CPU_LOADS(, false, bf16_, BF16) TC_CPU_LOADS(shared_, true, bf16_, BF16)

#define TC_CPU_MMA(KIND, TYPE, AL, BL, A_LAYOUT, B_LAYOUT)                                               \
  inline void tc_wmma_mma_##KIND##AL##_##BL(float* c, const unsigned* a, const unsigned* b) {          \
    tc_cpu::mma(c, a, b, tc_cpu::A_LAYOUT, tc_cpu::B_LAYOUT, tc_cpu::TYPE);                            \
  }
#define TC_CPU_MMAS(KIND, TYPE)                                                                         \
  TC_CPU_MMA(KIND, TYPE, row, row, ROW, ROW) TC_CPU_MMA(KIND, TYPE, row, col, ROW, COL)                \
  TC_CPU_MMA(KIND, TYPE, col, row, COL, ROW) TC_CPU_MMA(KIND, TYPE, col, col, COL, COL)
TC_CPU_MMAS(, F16) TC_CPU_MMAS(bf16_, BF16)

#define TC_CPU_STORE(KIND, TYPE)                                                                        \
  inline void tc_wmma_store_##KIND##_row(void* p, const float* c, unsigned ldm) {                      \
    tc_cpu::store(p, c, ldm, tc_cpu::ROW, tc_cpu::TYPE);                                               \
  }                                                                                                     \
  inline void tc_wmma_store_##KIND##_col(void* p, const float* c, unsigned ldm) {                      \
    tc_cpu::store(p, c, ldm, tc_cpu::COL, tc_cpu::TYPE);                                               \
  }
TC_CPU_STORE(f32, F32) TC_CPU_STORE(f16, F16) TC_CPU_STORE(bf16, BF16)
