"""The native VM's C source: the interpreter loop, registers, frames, objects, the storage pool
and the packed functions it runs without Python (``ember.vm.native`` binds and drives it).

Objects (``Obj``) are reference counted: tensors (data pointer, dtype index, shape, the storage
they view, or none when the memory belongs to the caller: inputs and constants; scalars and
``shape_of`` results keep their few bytes inline), storages (64-byte aligned buffers from a pool
that keeps freed buffers by size, so a model run again at the same shapes allocates nothing),
ADTs and closures. Registers live on one stack, frames on another; both grow, bounded by the
VM's ``max_depth``.

Packed functions run natively when they are compiled programs (``ember_run`` called by
address, with the program's dims set through ``ember_set_dims``), their shape functions, the
compiled Loop and Scan drivers, or the small control builtins; any other one is a call back
into Python. A program's sizes for one set of input shapes (output shapes, dims, buffer
offsets, workspace bytes) are computed once by the Python runtime (``CompiledModel``'s shape
function) and kept in a per-program table keyed by the input shapes: Nimble's shape function,
memoized; a miss, a dtype or an output that does not match asks Python, which raises the
runtime's own error for a bad input.

Every error returns NULL from ``vm_run`` with ``err_*`` set: a VM error (message), an error
raised by Python in a callback, a program's fault (its ``ember_run`` return code) or ``Fatal``.
Nothing here exits, aborts or writes outside a tensor: sizes, offsets, field indices, shapes
and ranks are checked before use.
"""

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

#define MAXDIM 16
#define MEMO_N 16
#define POOL_N 64
#define POOL_BYTES ((int64_t)1 << 30)
#define NDTYPES 64

enum { K_TENSOR = 1, K_STORAGE = 2, K_ADT = 3, K_CLOSURE = 4 };
enum { OP_MOVE, OP_RET, OP_IF, OP_GOTO, OP_LOAD_CONST, OP_LOAD_CONSTI, OP_ALLOC_STORAGE,
       OP_ALLOC_TENSOR, OP_ALLOC_TENSOR_REG, OP_ALLOC_ADT, OP_ALLOC_CLOSURE, OP_INVOKE,
       OP_INVOKE_CLOSURE, OP_INVOKE_PACKED, OP_GET_FIELD, OP_GET_TAG, OP_DEVICE_COPY,
       OP_SHAPE_OF, OP_RESHAPE_TENSOR, OP_FATAL, OP_KILL_REGISTER };
enum { E_NONE, E_VM, E_PYTHON, E_FAULT, E_FATAL };
enum { PK_PY, PK_PROGRAM, PK_SHAPES, PK_SCAN, PK_LOOP, PK_LOOP_TEST, PK_INCR, PK_DECR,
       PK_IS_NEG, PK_SCAN_LENGTH, PK_LOOP_ROWS, PK_LOOP_FITS, PK_SCAN_ROWS };
/* dtype kinds */
enum { DK_INT, DK_UINT, DK_BOOL, DK_FLOAT, DK_BF16, DK_OTHER };

typedef struct Obj {
    int32_t kind, refs;
    char *data;              /* tensor: first byte; storage: the aligned buffer */
    int64_t nbytes;          /* tensor: bytes of its elements; storage: usable bytes */
    int32_t dtype, ndim;
    struct Obj *base;        /* tensor: the storage it views (NULL: caller's memory) */
    int64_t shape[MAXDIM];
    int64_t inl[MAXDIM];     /* inline data of scalars and shape_of results */
    int64_t cap;             /* storage: allocated bytes (the pool's size class) */
    int64_t tag;             /* ADT tag, closure function */
    int32_t n, flags;        /* flags: 1 = read-only (constants, read-only inputs) */
    struct Obj **fields;
    struct Obj *next;
} Obj;

typedef int (*run_fn)(void *const *, void *const *, void *);
typedef int (*setdims_fn)(const int64_t *, const int64_t *);
typedef int (*py_fn)(int64_t packed, int64_t nargs, Obj **args);
typedef int (*prog_fn)(int64_t prog, int64_t nargs, Obj **args, int64_t with_outputs);

typedef struct {
    int64_t id, ws;
    int64_t *in_shapes, *out_shapes, *key, *offsets;   /* in/out: ndim-prefixed dims */
} Memo;

typedef struct {
    run_fn run;
    setdims_fn set_dims;
    int64_t *dims_cell;      /* the entry id whose dims the library holds (-1: Python's) */
    int n_in, n_out, n_key, n_off;
    int32_t in_dtype[64], out_dtype[64];
    Memo memo[MEMO_N];
    int n_memo, next_slot, last;
    int64_t next_id;
    char *ws_raw; int64_t ws_cap;
} Prog;

typedef struct { int kind; int64_t *p; int64_t np; } Packed;

typedef struct { int32_t func, pc; int64_t base; int32_t dst; } Frame;

typedef struct { int32_t nparams, nregs, ninstr; const int64_t *code; const int64_t *offs; } Func;

typedef struct {
    int64_t runs, instructions, calls, allocs, tensors, bytes_allocated, packed_calls;
    int64_t packed_ns, total_ns;
} Stats;

typedef struct VM {
    Stats stats;
    int64_t err_kind, err_func, err_pc, err_aux, err_aux2, err_depth;
    int64_t err_stack[8];    /* (function, pc) of up to 4 callers, innermost first */
    char err_msg[512];
    int nfuncs, nconsts, npacked, nprogs;
    Func *funcs;
    Obj **consts;
    Packed *packed;
    Prog *progs;
    int64_t max_depth;
    Obj **regs; int64_t regs_cap;
    Frame *frames; int64_t frames_cap;
    Obj *free_objs;
    int64_t pool_size[POOL_N]; char *pool_ptr[POOL_N]; int pool_n; int64_t pool_bytes;
    py_fn pycb; prog_fn progcb;
    int32_t dt_size[NDTYPES]; int8_t dt_kind[NDTYPES];
    int cur_func, cur_pc, running;
} VM;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int fail(VM *vm, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#include <stdarg.h>
static int fail(VM *vm, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(vm->err_msg, sizeof vm->err_msg, fmt, ap);
    va_end(ap);
    vm->err_kind = E_VM;
    return -1;
}

/* ------------------------------------------------------------------ objects and the pool */

static Obj *obj_new(VM *vm, int kind) {
    Obj *o = vm->free_objs;
    if (o) vm->free_objs = o->next;
    else if (!(o = malloc(sizeof(Obj)))) return NULL;
    o->kind = kind; o->refs = 1; o->data = NULL; o->nbytes = 0; o->dtype = 0; o->ndim = 0;
    o->base = NULL; o->cap = 0; o->tag = 0; o->n = 0; o->flags = 0; o->fields = NULL;
    o->next = NULL;
    return o;
}

static void pool_put(VM *vm, char *p, int64_t size) {
    if (vm->pool_n < POOL_N && vm->pool_bytes + size <= POOL_BYTES) {
        vm->pool_size[vm->pool_n] = size; vm->pool_ptr[vm->pool_n++] = p;
        vm->pool_bytes += size;
    } else {
        free(p);
    }
}

static char *pool_get(VM *vm, int64_t size) {
    for (int i = vm->pool_n - 1; i >= 0; --i)
        if (vm->pool_size[i] == size) {
            char *p = vm->pool_ptr[i];
            vm->pool_bytes -= size;
            vm->pool_n--;
            vm->pool_size[i] = vm->pool_size[vm->pool_n];
            vm->pool_ptr[i] = vm->pool_ptr[vm->pool_n];
            return p;
        }
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)size) != 0) return NULL;
    return p;
}

/* drops a reference; what it frees is freed with a work list (no recursion: a list of a
   million cells frees like one) */
static void unref(VM *vm, Obj *o) {
    if (!o || --o->refs > 0) return;
    o->next = NULL;
    Obj *work = o;
    while (work) {
        Obj *x = work;
        work = x->next;
        if (x->kind == K_STORAGE) pool_put(vm, x->data, x->cap);
        else if (x->kind == K_TENSOR) {
            Obj *b = x->base;
            if (b && --b->refs == 0) { b->next = work; work = b; }
        } else if (x->kind == K_ADT || x->kind == K_CLOSURE) {
            for (int i = 0; i < x->n; ++i) {
                Obj *f = x->fields[i];
                if (f && --f->refs == 0) { f->next = work; work = f; }
            }
            free(x->fields);
        }
        x->kind = 0;
        x->next = vm->free_objs; vm->free_objs = x;
    }
}

static inline Obj *ref(Obj *o) { if (o) o->refs++; return o; }

static inline void put(VM *vm, Obj **r, Obj *o) { Obj *old = *r; *r = o; unref(vm, old); }

static int64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256]; int64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static Obj *storage_new(VM *vm, int64_t nbytes) {
    int64_t cap = (nbytes + 63) / 64 * 64;
    if (cap == 0) cap = 64;
    if (nbytes >= ((int64_t)256 << 20)) {
        int64_t free_b = mem_available();
        if (free_b && nbytes > free_b) {
            fail(vm, "cannot allocate %.1f GiB for the model's tensors: %.1f GiB of memory is "
                 "available; use smaller input shapes", nbytes / 1073741824.0,
                 free_b / 1073741824.0);
            return NULL;
        }
    }
    Obj *s = obj_new(vm, K_STORAGE);
    if (!s) { fail(vm, "out of memory"); return NULL; }
    s->data = pool_get(vm, cap);
    if (!s->data) {
        s->kind = 0; s->next = vm->free_objs; vm->free_objs = s;
        fail(vm, "cannot allocate %ld bytes for the model's tensors: use smaller input shapes",
             (long)nbytes);
        return NULL;
    }
    s->nbytes = nbytes; s->cap = cap;
    vm->stats.allocs++; vm->stats.bytes_allocated += nbytes;
    return s;
}

static Obj *scalar_new(VM *vm, int64_t v, int32_t dtype) {
    Obj *t = obj_new(vm, K_TENSOR);
    if (!t) { fail(vm, "out of memory"); return NULL; }
    t->inl[0] = v; t->data = (char *)t->inl; t->dtype = dtype; t->ndim = 0;
    t->nbytes = vm->dt_size[dtype];
    return t;
}

static int64_t numel(const Obj *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
    return n;
}

/* ------------------------------------------------------------------ scalars */

static const char *kind_name(const Obj *o) {
    if (!o) return "an empty register";
    switch (o->kind) {
    case K_TENSOR: return "a tensor";
    case K_STORAGE: return "a storage";
    case K_ADT: return "an ADT";
    case K_CLOSURE: return "a closure";
    }
    return "an object";
}

/* element i of a tensor as an int64 (integer or bool tensors) */
static int64_t elem_i64(VM *vm, const Obj *t, int64_t i) {
    int s = vm->dt_size[t->dtype]; const char *p = t->data + i * s;
    if (vm->dt_kind[t->dtype] == DK_INT)
        return s == 8 ? *(const int64_t *)p : s == 4 ? *(const int32_t *)p
            : s == 2 ? *(const int16_t *)p : *(const int8_t *)p;
    return s == 8 ? (int64_t)*(const uint64_t *)p : s == 4 ? *(const uint32_t *)p
        : s == 2 ? *(const uint16_t *)p : *(const uint8_t *)p;
}

/* the value of a one-element tensor: *f = 1 and *dv for floats, else *iv */
static int scalar(VM *vm, const Obj *o, const char *what, int64_t *iv, double *dv, int *f) {
    if (!o || o->kind != K_TENSOR || numel(o) != 1)
        return fail(vm, "%s needs a one-element tensor, got %s%s", what, kind_name(o),
                    o && o->kind == K_TENSOR ? " of another size" : "");
    int k = vm->dt_kind[o->dtype], s = vm->dt_size[o->dtype];
    const char *p = o->data;
    *f = 0;
    if (k == DK_INT || k == DK_UINT || k == DK_BOOL) {
        *iv = elem_i64(vm, o, 0);
    } else if (k == DK_FLOAT) {
        *f = 1;
        *dv = s == 8 ? *(const double *)p : s == 4 ? *(const float *)p
            : (double)*(const _Float16 *)p;
    } else if (k == DK_BF16) {
        uint32_t bits = (uint32_t)*(const uint16_t *)p << 16; float x;
        memcpy(&x, &bits, 4); *f = 1; *dv = x;
    } else {
        return fail(vm, "%s: a scalar of this element type cannot be read", what);
    }
    return 0;
}

static int int_of(VM *vm, const Obj *o, const char *what, int64_t *v) {
    double d; int f;
    if (scalar(vm, o, what, v, &d, &f)) return -1;
    if (f) *v = (int64_t)d;
    return 0;
}

/* store v into element i of an integer, bool or float tensor (bounds checked) */
static int store(VM *vm, Obj *t, int64_t i, int64_t v, const char *what) {
    if (!t || t->kind != K_TENSOR) return fail(vm, "%s: its output is %s", what, kind_name(t));
    if (t->flags & 1) return fail(vm, "%s: its output is read-only (a constant)", what);
    int s = vm->dt_size[t->dtype], k = vm->dt_kind[t->dtype];
    if (i < 0 || (i + 1) * s > t->nbytes)
        return fail(vm, "%s: its output tensor has %ld bytes, too few", what, (long)t->nbytes);
    char *p = t->data + i * s;
    if (k == DK_BOOL) *(uint8_t *)p = v != 0;
    else if (k == DK_FLOAT && s == 4) *(float *)p = (float)v;
    else if (k == DK_FLOAT && s == 8) *(double *)p = (double)v;
    else if (k == DK_INT || k == DK_UINT) {
        if (s == 8) *(int64_t *)p = v; else if (s == 4) *(int32_t *)p = (int32_t)v;
        else if (s == 2) *(int16_t *)p = (int16_t)v; else *(int8_t *)p = (int8_t)v;
    } else return fail(vm, "%s: cannot store into this output's element type", what);
    return 0;
}

/* a 1-d integer tensor as a shape */
static int shape_from(VM *vm, const Obj *o, const char *what, int64_t *shape, int *ndim) {
    if (!o || o->kind != K_TENSOR || o->ndim != 1 ||
        (vm->dt_kind[o->dtype] != DK_INT && vm->dt_kind[o->dtype] != DK_UINT))
        return fail(vm, "%s needs a 1-d integer shape tensor, got %s", what, kind_name(o));
    if (o->shape[0] > MAXDIM)
        return fail(vm, "%s: rank %ld is more than the VM's %d", what, (long)o->shape[0], MAXDIM);
    *ndim = (int)o->shape[0];
    for (int i = 0; i < *ndim; ++i) {
        shape[i] = elem_i64(vm, o, i);
        if (shape[i] < 0) return fail(vm, "%s: shape has a negative dimension %ld", what,
                                      (long)shape[i]);
    }
    return 0;
}

static int bytes_of(VM *vm, const int64_t *shape, int ndim, int32_t dtype, int64_t *out) {
    int64_t n = vm->dt_size[dtype];
    for (int i = 0; i < ndim; ++i)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return fail(vm, "a tensor's byte size overflows 64 bits");
    *out = n;
    return 0;
}

static Obj *view(VM *vm, Obj *s, int64_t off, const int64_t *shape, int ndim, int32_t dtype,
                 const char *what) {
    if (!s || s->kind != K_STORAGE) {
        fail(vm, "%s needs a storage, got %s", what, kind_name(s)); return NULL;
    }
    int64_t nb;
    if (ndim < 0 || ndim > MAXDIM) {
        fail(vm, "%s of rank %d: the VM holds tensors of rank up to %d", what, ndim, MAXDIM);
        return NULL;
    }
    if (bytes_of(vm, shape, ndim, dtype, &nb)) return NULL;
    if (off < 0 || off > s->nbytes || nb > s->nbytes - off) {
        fail(vm, "%s of %ld bytes at offset %ld does not fit in a storage of %ld bytes; "
             "allocate a larger storage or fix the offset", what, (long)nb, (long)off,
             (long)s->nbytes);
        return NULL;
    }
    if (off % vm->dt_size[dtype]) {
        fail(vm, "%s at offset %ld: the offset is not a multiple of the element size %d", what,
             (long)off, vm->dt_size[dtype]);
        return NULL;
    }
    Obj *t = obj_new(vm, K_TENSOR);
    if (!t) { fail(vm, "out of memory"); return NULL; }
    t->data = s->data + off; t->nbytes = nb; t->dtype = dtype; t->ndim = ndim;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    t->base = ref(s);
    vm->stats.tensors++;
    return t;
}

/* ------------------------------------------------------------------ programs */

static int same_shape(const Obj *t, const int64_t *s) {
    if (!t || t->kind != K_TENSOR || t->ndim != s[0]) return 0;
    for (int i = 0; i < t->ndim; ++i) if (t->shape[i] != s[1 + i]) return 0;
    return 1;
}

static Memo *memo_find(VM *vm, Prog *p, Obj **ins) {
    for (int k = 0; k < p->n_memo; ++k) {
        int e = (p->last + k) % p->n_memo;
        Memo *m = &p->memo[e];
        const int64_t *s = m->in_shapes;
        int ok = 1;
        for (int i = 0; i < p->n_in && ok; ++i) {
            ok = same_shape(ins[i], s) && ins[i]->dtype == p->in_dtype[i];
            s += 1 + s[0];
        }
        if (ok) { p->last = e; return m; }
    }
    (void)vm;
    return NULL;
}

/* the memo entry of these inputs; on a miss Python computes it (or raises) */
static Memo *memo_of(VM *vm, int64_t prog, Obj **args, int nargs, int with_outputs) {
    Prog *p = &vm->progs[prog];
    for (int i = 0; i < p->n_in; ++i)
        if (!args[i] || args[i]->kind != K_TENSOR) {
            fail(vm, "program input %d is %s, not a tensor", i, kind_name(args[i]));
            return NULL;
        }
    Memo *m = memo_find(vm, p, args);
    if (m) return m;
    if (vm->progcb(prog, nargs, args, with_outputs) != 0) { vm->err_kind = E_PYTHON; return NULL; }
    m = memo_find(vm, p, args);
    if (!m) fail(vm, "program %ld: its sizes for these inputs were not recorded", (long)prog);
    return m;
}

static int outputs_match(VM *vm, Prog *p, Memo *m, Obj **outs) {
    const int64_t *s = m->out_shapes;
    for (int j = 0; j < p->n_out; ++j) {
        Obj *o = outs[j];
        if (!same_shape(o, s) || o->dtype != p->out_dtype[j] || (o->flags & 1) ||
            (o->nbytes && ((uintptr_t)o->data & 63)))
            return 0;
        s += 1 + s[0];
    }
    (void)vm;
    return 1;
}

static char *prog_ready(VM *vm, int64_t prog, Memo *m) {
    Prog *p = &vm->progs[prog];
    if (p->set_dims && *p->dims_cell != m->id) {
        if (p->set_dims(m->key, m->offsets) != 0) {
            fail(vm, "program %ld rejected its dims", (long)prog); return NULL;
        }
        *p->dims_cell = m->id;
    }
    if (m->ws > p->ws_cap) {
        free(p->ws_raw);
        p->ws_raw = NULL; p->ws_cap = 0;
        void *w = NULL;
        if (posix_memalign(&w, 64, (size_t)m->ws) != 0) {
            fail(vm, "cannot allocate a workspace of %ld bytes", (long)m->ws); return NULL;
        }
        p->ws_raw = w; p->ws_cap = m->ws;
    }
    return p->ws_raw ? p->ws_raw : (char *)p;   /* a program without workspace ignores it */
}

static int run_program(VM *vm, int64_t prog, Obj **args, int nargs) {
    Prog *p = &vm->progs[prog];
    if (nargs != p->n_in + p->n_out)
        return fail(vm, "packed program takes %d inputs and %d outputs, got %d arguments",
                    p->n_in, p->n_out, nargs);
    Memo *m = memo_of(vm, prog, args, nargs, 1);
    if (!m) return -1;
    if (!outputs_match(vm, p, m, args + p->n_in)) {
        if (vm->progcb(prog, nargs, args, 1) != 0) { vm->err_kind = E_PYTHON; return -1; }
        return fail(vm, "program %ld: its outputs do not have the shapes it writes", (long)prog);
    }
    char *ws = prog_ready(vm, prog, m);
    if (!ws) return -1;
    void *ip[p->n_in + 1], *op[p->n_out + 1];
    for (int i = 0; i < p->n_in; ++i) ip[i] = args[i]->data;
    for (int j = 0; j < p->n_out; ++j) op[j] = args[p->n_in + j]->data;
    int rc = p->run(ip, op, ws);
    if (rc != 0) { vm->err_kind = E_FAULT; vm->err_aux = prog; vm->err_aux2 = rc; return -1; }
    return 0;
}

/* (inputs..., (shape, nbytes) per output) */
static int program_shapes(VM *vm, int64_t prog, const int64_t *itemsizes, Obj **args,
                          int nargs) {
    Prog *p = &vm->progs[prog];
    if (nargs != p->n_in + 2 * p->n_out)
        return fail(vm, "a program's shape function takes %d arguments, got %d",
                    p->n_in + 2 * p->n_out, nargs);
    Memo *m = memo_of(vm, prog, args, nargs, 0);
    if (!m) return -1;
    const int64_t *s = m->out_shapes;
    for (int j = 0; j < p->n_out; ++j) {
        Obj *shape = args[p->n_in + 2 * j], *size = args[p->n_in + 2 * j + 1];
        int64_t n = itemsizes[j];
        for (int i = 0; i < s[0]; ++i) {
            if (store(vm, shape, i, s[1 + i], "a program's shape function")) return -1;
            n *= s[1 + i];
        }
        if (store(vm, size, 0, n, "a program's shape function")) return -1;
        s += 1 + s[0];
    }
    return 0;
}

/* ------------------------------------------------------------------ compiled Scan and Loop */

/* params: prog, n_x, n_state, n_caps, n_scan, state_bytes[n_state], x_rows[n_x],
   scan_bytes[n_scan], x_rev[n_x], out_rev[n_scan], then the ping-pong buffers' addresses
   (2 * n_state, set by Python) */
static int run_scan(VM *vm, const int64_t *q, Obj **args, int nargs) {
    int64_t prog = q[0]; int m = (int)q[1], n = (int)q[2], c = (int)q[3], s = (int)q[4];
    const int64_t *sb = q + 5, *xr = sb + n, *scb = xr + m, *xrev = scb + s, *orev = xrev + m;
    char *const *bufs = (char *const *)(orev + s);
    if (nargs != m + n + c + n + s) return fail(vm, "compiled Scan: %d arguments", nargs);
    Obj **xs = args, **init = args + m, **caps = args + m + n, **fin = args + m + n + c,
        **outs = args + m + n + c + n;
    for (int i = 0; i < nargs; ++i)
        if (!args[i] || args[i]->kind != K_TENSOR || (i >= m + n + c && (args[i]->flags & 1)))
            return fail(vm, "compiled Scan: argument %d is %s", i, args[i] && args[i]->kind ==
                        K_TENSOR ? "read-only" : kind_name(args[i]));
    int64_t trips = m ? (xs[0]->ndim ? xs[0]->shape[0] : 0) : 0;
    Obj rows[m + 1];
    Obj *ins[n + m + c + 1];
    for (int k = 0; k < n; ++k) ins[k] = init[k];
    for (int j = 0; j < m; ++j) {
        if (xs[j]->ndim < 1 || xs[j]->shape[0] != trips || xs[j]->nbytes < trips * xr[j])
            return fail(vm, "compiled Scan: scan input %d does not have %ld rows", j,
                        (long)trips);
        rows[j] = *xs[j];
        rows[j].ndim = xs[j]->ndim - 1;
        memmove(rows[j].shape, xs[j]->shape + 1, sizeof(int64_t) * (size_t)rows[j].ndim);
        ins[n + j] = &rows[j];
    }
    for (int k = 0; k < c; ++k) ins[n + m + k] = caps[k];
    for (int k = 0; k < n; ++k)
        if (fin[k]->nbytes < sb[k] || init[k]->nbytes < sb[k])
            return fail(vm, "compiled Scan: state %d has fewer than %ld bytes", k, (long)sb[k]);
    for (int j = 0; j < s; ++j)
        if (outs[j]->nbytes < trips * scb[j])
            return fail(vm, "compiled Scan: scan output %d is smaller than %ld rows", j,
                        (long)trips);
    Memo *me = memo_of(vm, prog, ins, n + m + c, 0);
    if (!me) return -1;
    char *ws = prog_ready(vm, prog, me);
    if (!ws) return -1;
    run_fn body = vm->progs[prog].run;
    void *bi[n + m + c + 1], *bo[n + s + 1];
    for (int k = 0; k < n; ++k) bi[k] = init[k]->data;
    for (int k = 0; k < c; ++k) bi[n + m + k] = caps[k]->data;
    for (int64_t t = 0; t < trips; ++t) {
        for (int j = 0; j < m; ++j) bi[n + j] = xs[j]->data + (xrev[j] ? trips - 1 - t : t) * xr[j];
        for (int k = 0; k < n; ++k) bo[k] = bufs[2 * k + (t & 1)];
        for (int j = 0; j < s; ++j)
            bo[n + j] = outs[j]->data + (orev[j] ? trips - 1 - t : t) * scb[j];
        int rc = body(bi, bo, ws);
        if (rc != 0) { vm->err_kind = E_FAULT; vm->err_aux = prog; vm->err_aux2 = rc; return -1; }
        for (int k = 0; k < n; ++k) bi[k] = bo[k];
    }
    for (int k = 0; k < n; ++k) memcpy(fin[k]->data, bi[k], (size_t)sb[k]);
    return 0;
}

/* params: prog, n_carried, n_caps, n_scan, carried_bytes[n], scan_bytes[s], bufs (2 * n);
   args: M, cond, init[n], caps[m], final[n], scan rows[s], trips_done */
static int run_loop(VM *vm, const int64_t *q, Obj **args, int nargs) {
    int64_t prog = q[0]; int n = (int)q[1], c = (int)q[2], s = (int)q[3];
    const int64_t *cb = q + 4, *scb = cb + n;
    char *const *bufs = (char *const *)(scb + s);
    if (nargs != 2 + n + c + n + s + 1) return fail(vm, "compiled Loop: %d arguments", nargs);
    for (int i = 0; i < nargs; ++i)
        if (!args[i] || args[i]->kind != K_TENSOR || (i >= 2 + n + c && (args[i]->flags & 1)))
            return fail(vm, "compiled Loop: argument %d is %s", i, args[i] && args[i]->kind ==
                        K_TENSOR ? "read-only" : kind_name(args[i]));
    Obj **init = args + 2, **caps = args + 2 + n, **fin = args + 2 + n + c,
        **outs = args + 2 + n + c + n, *done = args[nargs - 1];
    int has_trip = numel(args[0]) > 0, go = 1;
    int64_t trip = 0, cv = 1;
    if (has_trip && int_of(vm, args[0], "Loop's M", &trip)) return -1;
    if (numel(args[1]) > 0 && int_of(vm, args[1], "Loop's cond", &cv)) return -1;
    go = cv != 0;
    int64_t most = INT64_MAX;
    for (int j = 0; j < s; ++j)
        if (scb[j] && outs[j]->nbytes / scb[j] < most) most = outs[j]->nbytes / scb[j];
    for (int k = 0; k < n; ++k)
        if (fin[k]->nbytes < cb[k] || init[k]->nbytes < cb[k])
            return fail(vm, "compiled Loop: carried value %d has fewer than %ld bytes", k,
                        (long)cb[k]);
    int64_t it = 0; uint8_t cin = (uint8_t)go, cout = 0;
    Obj its = {0}, conds = {0};
    its.kind = conds.kind = K_TENSOR; its.refs = conds.refs = 1;
    its.data = (char *)&it; conds.data = (char *)&cin;
    its.dtype = (int32_t)q[4 + n + s + 2 * n]; conds.dtype = (int32_t)q[5 + n + s + 2 * n];
    its.nbytes = 8; conds.nbytes = 1;
    Obj *ins[2 + n + c + 1];
    ins[0] = &its; ins[1] = &conds;
    for (int k = 0; k < n; ++k) ins[2 + k] = init[k];
    for (int k = 0; k < c; ++k) ins[2 + n + k] = caps[k];
    Memo *me = memo_of(vm, prog, ins, 2 + n + c, 0);
    if (!me) return -1;
    char *ws = prog_ready(vm, prog, me);
    if (!ws) return -1;
    run_fn body = vm->progs[prog].run;
    void *bi[2 + n + c + 1], *bo[1 + n + s + 1];
    bi[0] = &it; bi[1] = &cin; bo[0] = &cout;
    for (int k = 0; k < n; ++k) bi[2 + k] = init[k]->data;
    for (int k = 0; k < c; ++k) bi[2 + n + k] = caps[k]->data;
    int64_t i = 0;
    while ((!has_trip || i < trip) && cin) {
        if (i >= most)
            return fail(vm, "compiled Loop: more trips than the %ld rows of its scan outputs",
                        (long)most);
        it = i;
        for (int k = 0; k < n; ++k) bo[1 + k] = bufs[2 * k + (i & 1)];
        for (int j = 0; j < s; ++j) bo[1 + n + j] = outs[j]->data + i * scb[j];
        int rc = body(bi, bo, ws);
        if (rc != 0) { vm->err_kind = E_FAULT; vm->err_aux = prog; vm->err_aux2 = rc; return -1; }
        for (int k = 0; k < n; ++k) bi[2 + k] = bo[1 + k];
        cin = cout;
        ++i;
    }
    for (int k = 0; k < n; ++k) memcpy(fin[k]->data, bi[2 + k], (size_t)cb[k]);
    return store(vm, done, 0, i, "compiled Loop");
}

/* ------------------------------------------------------------------ builtins */

static int first_i64(VM *vm, const Obj *t, const char *what, int64_t *v) {
    if (!t || t->kind != K_TENSOR || numel(t) < 1)
        return fail(vm, "%s needs a non-empty tensor", what);
    int k = vm->dt_kind[t->dtype];
    if (k != DK_INT && k != DK_UINT && k != DK_BOOL) {
        double d; int f;
        Obj one = *t; one.ndim = 0;
        if (scalar(vm, &one, what, v, &d, &f)) return -1;
        if (f) *v = (int64_t)d;
        return 0;
    }
    *v = elem_i64(vm, t, 0);
    return 0;
}

/* loop_rows (M, (shape, nbytes) per scan value) / loop_fits (M, fits); params: the most
   rows, the scan values' count k, then per value its rank, dims and itemsize */
static int loop_rows(VM *vm, const Packed *pk, Obj **a, int nargs) {
    const int64_t *q = pk->p;
    int64_t most = q[0], k = q[1], x;
    if (pk->kind == PK_LOOP_FITS) {
        if (nargs != 2) return fail(vm, "loop_fits called with %d arguments", nargs);
        int fits = 0;
        if (numel(a[0])) {
            if (first_i64(vm, a[0], "loop_fits", &x)) return -1;
            fits = (x > 0 ? x : 0) <= most;
        }
        return store(vm, a[1], 0, fits, "loop_fits");
    }
    if (nargs != 1 + 2 * k) return fail(vm, "loop_rows called with %d arguments", nargs);
    if (first_i64(vm, a[0], "loop_rows", &x)) return -1;
    int64_t rows = x > 0 ? x : 0;
    if (rows > most)
        return fail(vm, "a Loop with M = %ld trips would need more than %ld bytes for a scan "
                    "output; give the loop a smaller M", (long)rows, (long)1 << 30);
    const int64_t *e = q + 2;
    for (int j = 0; j < k; ++j) {
        int64_t r = e[0], nb = e[1 + r] * rows;
        if (store(vm, a[1 + 2 * j], 0, rows, "loop_rows")) return -1;
        for (int i = 0; i < r; ++i) {
            if (store(vm, a[1 + 2 * j], 1 + i, e[1 + i], "loop_rows")) return -1;
            nb *= e[1 + i];
        }
        if (store(vm, a[2 + 2 * j], 0, nb, "loop_rows")) return -1;
        e += 2 + r;
    }
    return 0;
}

static int run_builtin(VM *vm, const Packed *pk, Obj **a, int nargs) {
    int64_t x, y;
    const int64_t *q = pk->p;
    for (int i = 0; i < nargs; ++i)
        if (!a[i] || a[i]->kind != K_TENSOR)
            return fail(vm, "argument %d is %s, not a tensor", i, kind_name(a[i]));
    switch (pk->kind) {
    case PK_LOOP_TEST: {
        if (nargs != 4) break;
        int go = 1;
        if (int_of(vm, a[0], "loop_test", &x)) return -1;
        if (numel(a[1]) && (first_i64(vm, a[1], "loop_test", &y) || x >= y)) {
            if (vm->err_kind) return -1;
            go = 0;
        }
        if (go && numel(a[2]) && (first_i64(vm, a[2], "loop_test", &y) || y == 0)) {
            if (vm->err_kind) return -1;
            go = 0;
        }
        return store(vm, a[3], 0, go, "loop_test");
    }
    case PK_INCR: case PK_DECR: case PK_IS_NEG:
        if (nargs != 2) break;
        if (int_of(vm, a[0], "a counter", &x)) return -1;
        return store(vm, a[1], 0, pk->kind == PK_INCR ? x + 1 : pk->kind == PK_DECR ? x - 1
                     : x < 0, "a counter");
    case PK_SCAN_LENGTH: {
        if (nargs != pk->np + 1 || nargs < 2) break;
        int64_t len = -1;
        for (int i = 0; i + 1 < nargs; ++i) {
            if (q[i] < 0 || q[i] >= a[i]->ndim)
                return fail(vm, "scan input %d has no axis %ld", i, (long)q[i]);
            int64_t l = a[i]->shape[q[i]];
            if (len >= 0 && l != len)
                return fail(vm, "Scan inputs have different lengths on their scan axes: "
                            "[%ld, %ld]", (long)len, (long)l);
            len = l;
        }
        return store(vm, a[nargs - 1], 0, len, "scan_length");
    }
    case PK_LOOP_ROWS: case PK_LOOP_FITS: return loop_rows(vm, pk, a, nargs);
    case PK_SCAN_ROWS:
        if (nargs != 3) break;
        if (int_of(vm, a[0], "scan_rows", &x)) return -1;
        if (store(vm, a[2], 0, x, "scan_rows")) return -1;
        for (int i = 1; i < a[1]->ndim; ++i)
            if (store(vm, a[2], i, a[1]->shape[i], "scan_rows")) return -1;
        return 0;
    }
    return fail(vm, "builtin %d called with %d arguments", pk->kind, nargs);
}

static int invoke_packed(VM *vm, int64_t index, Obj **args, int nargs) {
    const Packed *pk = &vm->packed[index];
    int64_t t0 = now_ns();
    int rc;
    switch (pk->kind) {
    case PK_PY:
        for (int i = 0; i < nargs; ++i)
            if (!args[i]) { rc = fail(vm, "argument %d is an empty register", i); goto out; }
        rc = vm->pycb(index, nargs, args);
        if (rc) vm->err_kind = E_PYTHON;
        break;
    case PK_PROGRAM: rc = run_program(vm, pk->p[0], args, nargs); break;
    case PK_SHAPES: rc = program_shapes(vm, pk->p[0], pk->p + 1, args, nargs); break;
    case PK_SCAN: rc = run_scan(vm, pk->p, args, nargs); break;
    case PK_LOOP: rc = run_loop(vm, pk->p, args, nargs); break;
    default: rc = run_builtin(vm, pk, args, nargs);
    }
out:
    vm->stats.packed_ns += now_ns() - t0;
    vm->stats.packed_calls++;
    return rc;
}
"""
